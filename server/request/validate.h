// GenerateRequest -> GenerationParams. Every bad field is InvalidArgument with a message that
// names the field.
#pragma once

#include "absl/status/statusor.h"
#include "model/tokenizer.h"
#include "proto/fpa/v1/fpa.pb.h"
#include "server/request/request.h"

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
inline constexpr size_t kMaxStopBytes = 256;  // a stop sequence's or a bad word's
inline constexpr int kMaxBadWords = 64;

// Client strings echoed in errors are cut: an 8000-byte one would overflow gRPC's metadata
// limit (the client would see RESOURCE_EXHAUSTED instead), and an HTTP error would be as large
// as the request that caused it.
inline constexpr size_t kMaxEchoBytes = 64;
// `value` cut to kMaxEchoBytes on a UTF-8 character boundary, with its size when cut.
std::string clip(absl::string_view value);
// The same in quotes: 'value' or 'valu...' (N bytes).
std::string echo(absl::string_view value);

absl::StatusOr<GenerationParams> to_params(const v1::GenerateRequest& req,
                                           const RequestLimits& limits);

}  // namespace fpa::server
