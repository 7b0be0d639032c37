#include "server/openai_completion.h"

#include <algorithm>
#include <cstdio>

#include "model/utf8.h"
#include "server/openai_request.h"

namespace fpa::server {
namespace {

using json = nlohmann::json;

constexpr const char* kJson = "application/json";

const char* finish_reason(FinishReason r) {
  switch (r) {
    case FinishReason::kLength:
      return "length";
    case FinishReason::kEos:
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kNone:
      break;
  }
  return nullptr;
}

// A token as text: its own when that is valid UTF-8 (newline and other control characters
// included: JSON escapes them, and vLLM spells them so), else its bytes spelled out, and special
// ids as <special:N>, as vLLM does.
std::string token_string(const Tokenizer& tokenizer, int32_t id) {
  if (tokenizer.is_special(id)) return "<special:" + std::to_string(id) + ">";
  const std::string_view bytes = tokenizer.token_bytes(id);
  if (utf8::sanitize(bytes) == bytes) return std::string(bytes);
  std::string out = "bytes:";
  for (unsigned char c : bytes) {
    char buf[8];
    std::snprintf(buf, sizeof buf, "\\x%02X", c);
    out += buf;
  }
  return out;
}

json usage_json(const Usage& u) {
  return {{"prompt_tokens", u.prompt_tokens},
          {"completion_tokens", u.generated_tokens},
          {"total_tokens", u.prompt_tokens + u.generated_tokens},
          {"live_fraction", u.live_fraction},
          {"cache_bytes_held", u.cache_bytes_held},
          {"cache_bytes_full", u.cache_bytes_full},
          {"peak_live_keys", u.peak_live_keys},
          // vLLM's shape for prefix-cache hits; the two after it as gRPC's Usage names them.
          {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens}}},
          {"preemptions", u.preemptions},
          {"recomputed_tokens", u.recomputed_tokens}};
}

// Chat's shape: {"content": [{"token", "logprob", "top_logprobs": []}]}.
json chat_logprobs(const json& tokens, const std::vector<float>& logprobs) {
  json content = json::array();
  for (size_t i = 0; i < tokens.size() && i < logprobs.size(); ++i) {
    content.push_back(
        {{"token", tokens[i]}, {"logprob", logprobs[i]}, {"top_logprobs", json::array()}});
  }
  return {{"content", content}};
}

}  // namespace

CompletionCall::CompletionCall(std::shared_ptr<http::Exchange> exchange, CompletionMeta meta,
                               ServerMetrics& metrics)
    : exchange_(std::move(exchange)),
      meta_(std::move(meta)),
      metrics_(metrics),
      trimmer_(meta_.stop, meta_.include_stop) {}

void CompletionCall::start(Scheduler& scheduler, std::shared_ptr<Request> request) {
  request->sink = this;
  exchange_->on_disconnect([weak = std::weak_ptr<Request>(request)] {
    if (auto r = weak.lock()) r->cancel();  // the scheduler frees its pages
  });
  self_ = shared_from_this();
  if (absl::Status st = scheduler.submit(std::move(request)); !st.ok()) {
    fail(st);
    self_.reset();
  }
}

json CompletionCall::envelope(json choices) const {
  const char* object = !meta_.chat    ? "text_completion"
                       : meta_.stream ? "chat.completion.chunk"
                                      : "chat.completion";
  json e = {{"id", meta_.id},
            {"object", object},
            {"created", meta_.created},
            {"model", meta_.model},
            {"choices", std::move(choices)}};
  if (meta_.stream && meta_.include_usage) e["usage"] = nullptr;
  return e;
}

json CompletionCall::choice(const std::string& text, const std::vector<int32_t>& ids,
                            const std::vector<float>& logprobs, const char* reason) {
  json lp = nullptr;
  if (meta_.logprobs) {
    json tokens = json::array(), offsets = json::array();
    for (int32_t id : ids) {
      tokens.push_back(token_string(*meta_.tokenizer, id));
      offsets.push_back(text_offset_);
      // TODO(issue 25): with a JSON-escaped tokenizer this counts escaped, not output, bytes.
      text_offset_ += static_cast<int64_t>(meta_.tokenizer->token_bytes(id).size());
    }
    lp = {{"tokens", tokens},
          {"token_logprobs", logprobs},
          {"top_logprobs", nullptr},
          {"text_offset", offsets}};
    if (meta_.chat) lp = chat_logprobs(tokens, logprobs);
  }
  json c = {
      {"index", 0}, {"logprobs", lp}, {"finish_reason", reason ? json(reason) : json(nullptr)}};
  if (!meta_.chat) {
    c["text"] = text;
  } else if (!meta_.stream) {
    c["message"] = {{"role", "assistant"}, {"content", text}};
  } else {
    c["delta"] = {{"content", text}};
    // The first chunk names the role, as OpenAI's do.
    if (!role_sent_) c["delta"]["role"] = "assistant";
    role_sent_ = true;
  }
  return c;
}

// The chunk's text less stop strings and stop tokens (the token's own text: the chunk may start
// with the end of a character split before it).
std::string CompletionCall::trim(const TokenChunk& chunk) {
  const bool stop_token =
      !chunk.ids.empty() && !meta_.include_stop &&
      std::ranges::find(meta_.stop_token_ids, chunk.ids.back()) != meta_.stop_token_ids.end();
  if (!stop_token) return trimmer_.push(chunk.text);
  std::string_view text = chunk.text;
  const std::string_view own = meta_.tokenizer->token_bytes(chunk.ids.back());
  if (text.ends_with(own)) text.remove_suffix(own.size());
  std::string out = trimmer_.push(text);
  trimmer_.stop_here();
  return out;
}

void CompletionCall::send_event(const json& event) {
  if (!streaming_) {
    exchange_->start_stream("text/event-stream");
    streaming_ = true;
  }
  exchange_->send("data: " + json_text(event) + "\n\n");
}

void CompletionCall::on_tokens(TokenChunk chunk) {
  chunk.text = trim(chunk);
  if (!meta_.stream) {
    text_ += chunk.text;
    ids_.insert(ids_.end(), chunk.ids.begin(), chunk.ids.end());
    logprobs_.insert(logprobs_.end(), chunk.logprobs.begin(), chunk.logprobs.end());
    return;
  }
  send_event(envelope(json::array({choice(chunk.text, chunk.ids, chunk.logprobs, nullptr)})));
}

void CompletionCall::on_finish(Completion done) {
  std::shared_ptr<CompletionCall> keep = std::move(self_);
  // An error before anything was streamed still gets its HTTP status.
  if (!done.status.ok() && !streaming_) return fail(done.status);
  metrics_.count_request(static_cast<int>(done.status.code()));
  const char* reason = finish_reason(done.reason);
  if (!meta_.stream) {
    json body = envelope(
        json::array({choice(text_ + trimmer_.finish(done.text_tail), ids_, logprobs_, reason)}));
    body["usage"] = usage_json(done.usage);
    return exchange_->reply(200, kJson, json_text(body));
  }
  if (done.status.ok()) {
    send_event(envelope(json::array({choice(trimmer_.finish(done.text_tail), {}, {}, reason)})));
    if (meta_.include_usage) {
      json last = envelope(json::array());
      last["usage"] = usage_json(done.usage);
      send_event(last);
    }
  } else {
    send_event(api_error(done.status).body());
  }
  exchange_->send("data: [DONE]\n\n");
  exchange_->end();
}

void CompletionCall::fail(const absl::Status& status) {
  metrics_.count_request(static_cast<int>(status.code()));
  reply_error(*exchange_, api_error(status));
}

void reply_error(http::Exchange& exchange, const ApiError& e) {
  // A full queue drains within about a second of decode steps; clients that honour Retry-After
  // (the openai SDKs do) come back then instead of at once.
  if (e.http_status == 429) exchange.add_header("Retry-After", "1");
  exchange.reply(e.http_status, kJson, json_text(e.body()));
}

}  // namespace fpa::server
