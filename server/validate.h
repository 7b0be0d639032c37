// GenerateRequest -> GenerationParams. Every bad field is InvalidArgument with a message that
// names the field.
#pragma once

#include "absl/status/statusor.h"
#include "model/tokenizer.h"
#include "proto/fpa/v1/fpa.pb.h"
#include "server/request.h"

namespace fpa::server {

struct RequestLimits {
  int vocab_size = 259;
  const Tokenizer* tokenizer = nullptr;  // the model's: encodes text prompts
  int max_prompt_tokens = 65536;
  int max_new_tokens = 4096;
  float default_tau = 20.0f;
};

inline constexpr int kDefaultMaxNewTokens = 64;
inline constexpr int kMaxStopSequences = 16;
inline constexpr size_t kMaxStopBytes = 256;

absl::StatusOr<GenerationParams> to_params(const v1::GenerateRequest& req,
                                           const RequestLimits& limits);

}  // namespace fpa::server
