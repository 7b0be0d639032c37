#include "server/openai/openai_completion.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <utility>

#include "model/utf8.h"
#include "server/openai/openai_request.h"

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

// vLLM's prompt_logprobs: null for the first token, then per token {id: {logprob, rank,
// decoded_token}} for the token itself and its `alternatives` likeliest.
json vllm_prompt_logprobs(const Tokenizer& tokenizer, const TokenChunk& prompt, int alternatives) {
  json out = json::array({nullptr});
  auto entry = [&](float logprob, int32_t rank, int32_t id) {
    return json{
        {"logprob", logprob}, {"rank", rank}, {"decoded_token", token_string(tokenizer, id)}};
  };
  for (size_t i = 1; i < prompt.ids.size(); ++i) {
    json at = json::object();
    at[std::to_string(prompt.ids[i])] = entry(prompt.logprobs[i], prompt.ranks[i], prompt.ids[i]);
    const std::vector<TokenLogprob>& top = prompt.top[i];
    for (size_t j = 0; j < top.size() && j < static_cast<size_t>(alternatives); ++j) {
      at.emplace(std::to_string(top[j].token),
                 entry(top[j].logprob, static_cast<int32_t>(j + 1), top[j].token));
    }
    out.push_back(std::move(at));
  }
  return out;
}

// `more` appended to `to`: ids, logprobs, alternatives and text.
void append(TokenChunk& to, const TokenChunk& more) {
  to.ids.insert(to.ids.end(), more.ids.begin(), more.ids.end());
  to.logprobs.insert(to.logprobs.end(), more.logprobs.begin(), more.logprobs.end());
  to.top.insert(to.top.end(), more.top.begin(), more.top.end());
  to.text += more.text;
}

// The usage of a request of several choices: counts summed (each prompt once), the peak the
// largest, the live fraction the mean.
void add_usage(Usage& all, const Usage& u, bool first_of_prompt, size_t choices) {
  if (first_of_prompt) all.prompt_tokens += u.prompt_tokens;
  if (first_of_prompt) all.cached_tokens += u.cached_tokens;
  all.generated_tokens += u.generated_tokens;
  all.peak_live_keys = std::max(all.peak_live_keys, u.peak_live_keys);
  all.live_fraction += u.live_fraction / static_cast<double>(choices);
  all.cache_bytes_held += u.cache_bytes_held;
  all.cache_bytes_full += u.cache_bytes_full;
  all.preemptions += u.preemptions;
  all.recomputed_tokens += u.recomputed_tokens;
}

}  // namespace

class CompletionCall::Choice final : public RequestSink {
 public:
  Choice(CompletionCall& call, int index, const CompletionMeta& meta)
      : index(index), trimmer(meta.stop, meta.include_stop), call_(call) {}
  void on_tokens(TokenChunk chunk) override { call_.on_tokens(*this, std::move(chunk)); }
  void on_finish(Completion done) override { call_.on_finish(*this, std::move(done)); }

  const int index;
  std::shared_ptr<Request> request;
  StopTrimmer trimmer;
  TokenChunk gathered;  // a whole response's tokens and text
  const char* reason = nullptr;
  bool role_sent = false;
  int64_t text_offset = 0;  // bytes of text before the next token, for logprobs.text_offset
  json prompt_logprobs;     // vLLM's, until the first response or event that carries them

 private:
  CompletionCall& call_;
};

CompletionCall::CompletionCall(std::shared_ptr<http::Exchange> exchange, CompletionMeta meta,
                               ServerMetrics& metrics)
    : exchange_(std::move(exchange)), meta_(std::move(meta)), metrics_(metrics) {}

CompletionCall::~CompletionCall() = default;  // Choice is complete here

void CompletionCall::start(Scheduler& scheduler, std::vector<std::shared_ptr<Request>> requests) {
  std::unique_lock lock(mu_);
  std::vector<std::weak_ptr<Request>> weak;
  for (size_t i = 0; i < requests.size(); ++i) {
    choices_.push_back(std::make_unique<Choice>(*this, static_cast<int>(i), meta_));
    choices_.back()->request = requests[i];
    requests[i]->sink = choices_.back().get();
    weak.push_back(requests[i]);
  }
  exchange_->on_disconnect([weak = std::move(weak)] {
    for (const auto& w : weak) {
      if (auto r = w.lock()) r->cancel();  // the scheduler frees its pages
    }
  });
  self_ = shared_from_this();
  for (auto& r : requests) {
    if (absl::Status st = scheduler.submit(r); !st.ok()) {
      error_ = st;
      break;
    }
    ++pending_;
  }
  if (error_.ok()) return;
  cancel_all();
  if (pending_ > 0) return;  // the last to finish answers
  std::shared_ptr<CompletionCall> keep = std::move(self_);
  lock.unlock();
  metrics_.count_request(static_cast<int>(error_.code()));
  reply_error(*exchange_, api_error(error_));
}

void CompletionCall::cancel_all() {
  for (auto& c : choices_) c->request->cancel();
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
// One choice's event; its prompt_logprobs go in the first (in the choice for completions, at the
// top for chat, as vLLM places them).
json CompletionCall::event(Choice& c, const TokenChunk& tokens, const char* reason) {
  json e = envelope(json::array({choice(c, tokens, reason)}));
  if (!c.prompt_logprobs.is_null()) {
    json& at = meta_.chat ? e : e["choices"][0];
    at["prompt_logprobs"] = std::exchange(c.prompt_logprobs, nullptr);
  }
  return e;
}

json CompletionCall::choice(Choice& ch, const TokenChunk& tokens, const char* reason) {
  json lp = nullptr;
  if (meta_.logprobs) {
    const Tokenizer& tokenizer = *meta_.tokenizer;
    json strings = json::array(), offsets = json::array(), top = json::array();
    for (size_t i = 0; i < tokens.ids.size(); ++i) {
      strings.push_back(token_string(tokenizer, tokens.ids[i]));
      offsets.push_back(ch.text_offset);
      // TODO(issue 25): with a JSON-escaped tokenizer this counts escaped, not output, bytes.
      ch.text_offset += static_cast<int64_t>(tokenizer.token_bytes(tokens.ids[i]).size());
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
  json c = {{"index", ch.index},
            {"logprobs", lp},
            {"finish_reason", reason ? json(reason) : json(nullptr)}};
  if (!meta_.chat) {
    c["text"] = tokens.text;
  } else if (!meta_.stream) {
    c["message"] = {{"role", "assistant"}, {"content", tokens.text}};
  } else {
    c["delta"] = {{"content", tokens.text}};
    // The first chunk names the role, as OpenAI's do.
    if (!ch.role_sent) c["delta"]["role"] = "assistant";
    ch.role_sent = true;
  }
  return c;
}

// The chunk's text less stop strings and stop tokens (the token's own text: the chunk may start
// with the end of a character split before it).
std::string CompletionCall::trim(Choice& c, const TokenChunk& chunk) {
  const bool stop_token =
      !chunk.ids.empty() && !meta_.include_stop &&
      std::ranges::find(meta_.stop_token_ids, chunk.ids.back()) != meta_.stop_token_ids.end();
  if (!stop_token) return c.trimmer.push(chunk.text);
  std::string_view text = chunk.text;
  const std::string_view own = meta_.tokenizer->token_bytes(chunk.ids.back());
  if (text.ends_with(own)) text.remove_suffix(own.size());
  std::string out = c.trimmer.push(text);
  c.trimmer.stop_here();
  return out;
}

void CompletionCall::send_event(const json& event) {
  if (!streaming_) {
    exchange_->start_stream("text/event-stream");
    streaming_ = true;
  }
  exchange_->send("data: " + json_text(event) + "\n\n");
}

void CompletionCall::on_tokens(Choice& c, TokenChunk chunk) {
  std::lock_guard lock(mu_);
  if (chunk.prompt) {
    if (meta_.prompt_logprobs) {
      c.prompt_logprobs = vllm_prompt_logprobs(*meta_.tokenizer, chunk, *meta_.prompt_logprobs);
    }
    if (!meta_.echo) return;  // prompt_logprobs go out with the first token
    // The echoed prompt is the text of its tokens, so that text_offset counts it; its
    // alternatives were scored for the larger of logprobs and prompt_logprobs.
    chunk.text = meta_.tokenizer->decode(chunk.ids);
    for (auto& top : chunk.top) top.resize(std::min<size_t>(top.size(), meta_.top_logprobs));
  } else {
    chunk.text = trim(c, chunk);
  }
  if (!meta_.stream) return append(c.gathered, chunk);
  if (error_.ok()) send_event(event(c, chunk, nullptr));
}

void CompletionCall::on_finish(Choice& c, Completion done) {
  std::shared_ptr<CompletionCall> keep;  // declared first: `this` outlives the lock
  std::lock_guard lock(mu_);
  --pending_;
  if (!done.status.ok() && error_.ok()) {
    error_ = done.status;
    cancel_all();  // one failed choice fails the request
  }
  c.reason = finish_reason(done.reason);
  c.gathered.text += c.trimmer.finish(done.text_tail);
  add_usage(usage_, done.usage, c.index % meta_.n == 0, choices_.size());
  if (meta_.stream && error_.ok()) {
    TokenChunk last;
    last.text = c.gathered.text;  // streamed text is never gathered: only the tail is here
    send_event(event(c, last, c.reason));
  }
  if (pending_ > 0) return;
  keep = std::move(self_);
  answer();
}

void CompletionCall::answer() {
  metrics_.count_request(static_cast<int>(error_.code()));
  // An error before anything was streamed still gets its HTTP status.
  if (!error_.ok() && !streaming_) return reply_error(*exchange_, api_error(error_));
  if (!meta_.stream) {
    json all = json::array();
    for (auto& c : choices_) {
      all.push_back(choice(*c, c->gathered, c->reason));
      if (!meta_.chat && !c->prompt_logprobs.is_null()) {
        all.back()["prompt_logprobs"] = std::move(c->prompt_logprobs);
      }
    }
    json body = envelope(std::move(all));
    if (meta_.chat && !choices_.empty() && !choices_[0]->prompt_logprobs.is_null()) {
      body["prompt_logprobs"] = std::move(choices_[0]->prompt_logprobs);  // one prompt in a chat
    }
    body["usage"] = usage_json(usage_);
    return exchange_->reply(200, kJson, json_text(body));
  }
  if (error_.ok() && meta_.include_usage) {
    json last = envelope(json::array());
    last["usage"] = usage_json(usage_);
    send_event(last);
  }
  if (!error_.ok()) send_event(api_error(error_).body());
  exchange_->send("data: [DONE]\n\n");
  exchange_->end();
}

void reply_error(http::Exchange& exchange, const ApiError& e) {
  // A full queue drains within about a second of decode steps; clients that honour Retry-After
  // (the openai SDKs do) come back then instead of at once.
  if (e.http_status == 429) exchange.add_header("Retry-After", "1");
  exchange.reply(e.http_status, kJson, json_text(e.body()));
}

}  // namespace fpa::server
