// One POST /v1/completions in flight: the RequestSink that turns the scheduler's tokens into an
// OpenAI completion, whole or as Server-Sent Events ending in "data: [DONE]".
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "model/tokenizer.h"
#include "nlohmann/json.hpp"
#include "server/http/http_server.h"
#include "server/metrics/metrics.h"
#include "server/openai/openai_request.h"
#include "server/request/request.h"
#include "server/request/stop_strings.h"
#include "server/scheduler/scheduler.h"

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
  int n = 1;                             // choices per prompt
  std::optional<int> prompt_logprobs;    // vLLM's prompt_logprobs: alternatives per prompt token
};

// An OpenAI-style error response (429s with Retry-After).
void reply_error(http::Exchange& exchange, const ApiError& e);

// One completion request in flight: one scheduler request per choice (prompts x n), answered
// together, or streamed as each choice's tokens come (chunks carry the choice's index).
class CompletionCall final : public std::enable_shared_from_this<CompletionCall> {
 public:
  CompletionCall(std::shared_ptr<http::Exchange> exchange, CompletionMeta meta,
                 ServerMetrics& metrics);
  ~CompletionCall();

  // Queues `requests` (choice i = requests[i]); answers the error itself when that fails, after
  // cancelling those already queued. Call on the HTTP I/O thread, inside the handler (a hang-up
  // then cancels them all).
  void start(Scheduler& scheduler, std::vector<std::shared_ptr<Request>> requests);

 private:
  class Choice;

  void on_tokens(Choice& c, TokenChunk chunk);
  void on_finish(Choice& c, Completion done);
  void answer();  // every choice finished
  nlohmann::json envelope(nlohmann::json choices) const;
  nlohmann::json choice(Choice& c, const TokenChunk& tokens, const char* finish_reason);
  nlohmann::json event(Choice& c, const TokenChunk& tokens, const char* finish_reason);
  std::string trim(Choice& c, const TokenChunk& chunk);
  void send_event(const nlohmann::json& event);
  void cancel_all();

  std::shared_ptr<http::Exchange> exchange_;
  const CompletionMeta meta_;
  ServerMetrics& metrics_;
  std::shared_ptr<CompletionCall> self_;  // alive from start() until the last choice finishes
  // The scheduler thread calls the choices while start() may still be queueing on the I/O thread.
  std::mutex mu_;
  std::vector<std::unique_ptr<Choice>> choices_;
  size_t pending_ = 0;  // queued choices not yet finished
  absl::Status error_;  // the first failure: it answers the whole request
  Usage usage_;         // summed over the choices (prompt tokens once per prompt)
  bool streaming_ = false;
};

}  // namespace fpa::server
