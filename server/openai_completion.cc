#include "server/openai_completion.h"

#include <algorithm>
#include <cmath>
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

// Completions' shape: {token: logprob} per position, null where nothing predicts the token.
json completion_top(const Tokenizer& tokenizer, const std::vector<TokenLogprob>& top,
                    float logprob) {
  if (std::isnan(logprob)) return nullptr;
  json alternatives = json::object();
  for (const TokenLogprob& t : top) alternatives[token_string(tokenizer, t.token)] = t.logprob;
  return alternatives;
}

// Chat's shape: {"content": [{"token", "logprob", "top_logprobs": [{"token", "logprob"}]}]}.
json chat_logprobs(const Tokenizer& tokenizer, const json& tokens, const TokenChunk& chunk) {
  json content = json::array();
  for (size_t i = 0; i < tokens.size() && i < chunk.logprobs.size(); ++i) {
    json top = json::array();
    if (i < chunk.top.size()) {
      for (const TokenLogprob& t : chunk.top[i]) {
        top.push_back({{"token", token_string(tokenizer, t.token)}, {"logprob", t.logprob}});
      }
    }
    content.push_back(
        {{"token", tokens[i]}, {"logprob", chunk.logprobs[i]}, {"top_logprobs", top}});
  }
  return {{"content", content}};
}

// `more` appended to `to`: ids, logprobs, alternatives and text.
void append(TokenChunk& to, const TokenChunk& more) {
  to.ids.insert(to.ids.end(), more.ids.begin(), more.ids.end());
  to.logprobs.insert(to.logprobs.end(), more.logprobs.begin(), more.logprobs.end());
  to.top.insert(to.top.end(), more.top.begin(), more.top.end());
  to.text += more.text;
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

json CompletionCall::choice(const TokenChunk& tokens, const char* reason) {
  json lp = nullptr;
  if (meta_.logprobs) {
    const Tokenizer& tokenizer = *meta_.tokenizer;
    json strings = json::array(), offsets = json::array(), top = json::array();
    for (size_t i = 0; i < tokens.ids.size(); ++i) {
      strings.push_back(token_string(tokenizer, tokens.ids[i]));
      offsets.push_back(text_offset_);
      // TODO(issue 25): with a JSON-escaped tokenizer this counts escaped, not output, bytes.
      text_offset_ += static_cast<int64_t>(tokenizer.token_bytes(tokens.ids[i]).size());
      if (i < tokens.top.size() && i < tokens.logprobs.size()) {
        top.push_back(completion_top(tokenizer, tokens.top[i], tokens.logprobs[i]));
      }
    }
    // NaN (the echoed prompt's first token) is written as null.
    lp = {{"tokens", strings},
          {"token_logprobs", tokens.logprobs},
          {"top_logprobs", meta_.top_logprobs > 0 ? top : json(nullptr)},
          {"text_offset", offsets}};
    if (meta_.chat) lp = chat_logprobs(tokenizer, strings, tokens);
  }
  json c = {
      {"index", 0}, {"logprobs", lp}, {"finish_reason", reason ? json(reason) : json(nullptr)}};
  if (!meta_.chat) {
    c["text"] = tokens.text;
  } else if (!meta_.stream) {
    c["message"] = {{"role", "assistant"}, {"content", tokens.text}};
  } else {
    c["delta"] = {{"content", tokens.text}};
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
  if (chunk.prompt) {
    if (!meta_.echo) return;
    // The echoed prompt is the text of its tokens, so that text_offset counts it.
    chunk.text = meta_.tokenizer->decode(chunk.ids);
  } else {
    chunk.text = trim(chunk);
  }
  if (!meta_.stream) return append(gathered_, chunk);
  send_event(envelope(json::array({choice(chunk, nullptr)})));
}

void CompletionCall::on_finish(Completion done) {
  std::shared_ptr<CompletionCall> keep = std::move(self_);
  // An error before anything was streamed still gets its HTTP status.
  if (!done.status.ok() && !streaming_) return fail(done.status);
  metrics_.count_request(static_cast<int>(done.status.code()));
  const char* reason = finish_reason(done.reason);
  if (!meta_.stream) {
    gathered_.text += trimmer_.finish(done.text_tail);
    json body = envelope(json::array({choice(gathered_, reason)}));
    body["usage"] = usage_json(done.usage);
    return exchange_->reply(200, kJson, json_text(body));
  }
  if (done.status.ok()) {
    TokenChunk last;
    last.text = trimmer_.finish(done.text_tail);
    send_event(envelope(json::array({choice(last, reason)})));
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
