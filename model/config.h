// config.json (docs/model-format.md) -> ModelConfig, with every field checked.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "model/model.h"
#include "nlohmann/json.hpp"

namespace fpa {

// `path` only names the file in error messages.
absl::StatusOr<ModelConfig> parse_model_config(const std::string& json_text,
                                               const std::string& path);

// The Hugging Face config.json of the Forgetting Transformer family (hf_config.cc): options the
// server does not implement are refused naming the key.
absl::StatusOr<ModelConfig> parse_hf_config(const nlohmann::json& j, const std::string& json_text,
                                            const std::string& path);

// The size limits every config obeys (docs/model-format.md), so that every index fits an int.
absl::Status check_config_limits(const std::string& path, const ModelConfig& c);

const char* attention_kind_name(AttentionKind kind);

}  // namespace fpa
