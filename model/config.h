// config.json (docs/model-format.md) -> ModelConfig, with every field checked.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "model/model.h"

namespace fpa {

// `path` only names the file in error messages.
absl::StatusOr<ModelConfig> parse_model_config(const std::string& json_text,
                                               const std::string& path);

const char* attention_kind_name(AttentionKind kind);

}  // namespace fpa
