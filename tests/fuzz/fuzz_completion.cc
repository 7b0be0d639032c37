// A /v1/completions body, and the same bytes as a /v1/chat/completions body -> CompletionRequest
// -> GenerationParams, the path of every OpenAI request (server/openai/openai_api.cc): the depth
// check, the JSON parse, the chat template, the field parser and the shared validation. Nothing may
// crash, recurse without bound, or echo a long client string.
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "model/model.h"
#include "model/tokenizer.h"
#include "server/openai/openai_request.h"
#include "server/request/validate.h"

namespace {

void check_error(const absl::Status& st) {
  // Every client string in a message is cut to 64 bytes; the longest fixed text is far below.
  if (st.message().size() > 600) std::abort();
  fpa::server::ApiError e = fpa::server::api_error(st);
  (void)fpa::server::json_text(e.body());
}

void check_body(std::string_view body, bool chat) {
  static const std::unique_ptr<fpa::Tokenizer> tokenizer = [] {
    fpa::ModelConfig config;
    config.vocab_size = 259;
    return fpa::make_byte_tokenizer(config);
  }();
  const fpa::server::RequestLimits limits{259, tokenizer.get(), 512, 128, 20.0f};
  absl::StatusOr<fpa::server::CompletionRequest> req =
      fpa::server::parse_completion_body(body, chat, limits);
  if (!req.ok()) return check_error(req.status());
  for (size_t i = 0; i < req->prompts.size(); ++i) {
    absl::StatusOr<fpa::server::GenerationParams> p =
        fpa::server::to_params(req->for_prompt(i), limits);
    if (!p.ok()) return check_error(p.status());
    // Only a scored prompt (echo) may ask for no new token.
    const int least = p->prompt_logprobs ? 0 : 1;
    if (p->prompt.empty() || static_cast<int>(p->prompt.size()) > limits.max_prompt_tokens ||
        p->max_new_tokens < least || p->max_new_tokens > limits.max_new_tokens) {
      std::abort();
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  check_body(body, /*chat=*/false);
  check_body(body, /*chat=*/true);
  return 0;
}
