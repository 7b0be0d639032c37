// One POST /v1/completions in flight: the RequestSink that turns the scheduler's tokens into an
// OpenAI completion, whole or as Server-Sent Events ending in "data: [DONE]".
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model/tokenizer.h"
#include "nlohmann/json.hpp"
#include "server/http_server.h"
#include "server/metrics.h"
#include "server/openai_request.h"
#include "server/request.h"
#include "server/scheduler.h"
#include "server/stop_strings.h"

namespace fpa::server {

struct CompletionMeta {
  std::string id;  // "cmpl-..."
  std::string model;
  int64_t created = 0;  // Unix seconds
  bool stream = false;
  bool include_usage = false;
  bool logprobs = false;
  int top_logprobs = 0;           // alternatives per token
  bool echo = false;              // the prompt (scored: a TokenChunk::prompt) before the completion
  bool chat = false;              // /v1/chat/completions: message/delta instead of text
  std::vector<std::string> stop;  // trimmed from the text, with what follows
  bool include_stop = false;      // ... unless include_stop_str_in_output
  std::vector<int32_t> stop_token_ids;   // their text is trimmed likewise
  const Tokenizer* tokenizer = nullptr;  // the model's: spells logprobs tokens
};

// An OpenAI-style error response (429s with Retry-After).
void reply_error(http::Exchange& exchange, const ApiError& e);

class CompletionCall final : public RequestSink,
                             public std::enable_shared_from_this<CompletionCall> {
 public:
  CompletionCall(std::shared_ptr<http::Exchange> exchange, CompletionMeta meta,
                 ServerMetrics& metrics);

  // Queues `request` with this call as its sink; answers the error itself when that fails.
  // Call on the HTTP I/O thread, inside the handler (a hang-up then cancels the request).
  void start(Scheduler& scheduler, std::shared_ptr<Request> request);

  void on_tokens(TokenChunk chunk) override;
  void on_finish(Completion done) override;

 private:
  nlohmann::json envelope(nlohmann::json choices) const;
  nlohmann::json choice(const TokenChunk& tokens, const char* finish_reason);
  std::string trim(const TokenChunk& chunk);
  void send_event(const nlohmann::json& event);
  void fail(const absl::Status& status);

  std::shared_ptr<http::Exchange> exchange_;
  const CompletionMeta meta_;
  ServerMetrics& metrics_;
  std::shared_ptr<CompletionCall> self_;  // alive from start() until on_finish
  // The scheduler thread's (after start): what a whole response gathers, and the stream state.
  StopTrimmer trimmer_;
  TokenChunk gathered_;  // a whole response's tokens and text
  bool streaming_ = false;
  bool role_sent_ = false;
  int64_t text_offset_ = 0;  // bytes of text before the next token, for logprobs.text_offset
};

}  // namespace fpa::server
