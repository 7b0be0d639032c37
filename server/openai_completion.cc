#include "server/openai_completion.h"

#include <cstdio>

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

// A byte token as text: ASCII as itself, other bytes and special ids spelled out, as vLLM does.
std::string token_string(int32_t id) {
  if (id >= 0x20 && id < 0x7f) return std::string(1, static_cast<char>(id));
  char buf[32];
  std::snprintf(buf, sizeof buf, id < 256 ? "bytes:\\x%02X" : "<special:%d>", id);
  return buf;
}

json usage_json(const Usage& u) {
  return {{"prompt_tokens", u.prompt_tokens},
          {"completion_tokens", u.generated_tokens},
          {"total_tokens", u.prompt_tokens + u.generated_tokens},
          {"live_fraction", u.live_fraction},
          {"cache_bytes_held", u.cache_bytes_held},
          {"cache_bytes_full", u.cache_bytes_full},
          {"peak_live_keys", u.peak_live_keys}};
}

}  // namespace

CompletionCall::CompletionCall(std::shared_ptr<http::Exchange> exchange, CompletionMeta meta,
                               ServerMetrics& metrics)
    : exchange_(std::move(exchange)), meta_(std::move(meta)), metrics_(metrics) {}

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
  json e = {{"id", meta_.id},
            {"object", "text_completion"},
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
      tokens.push_back(token_string(id));
      offsets.push_back(text_offset_);
      if (id < 256) ++text_offset_;
    }
    lp = {{"tokens", tokens},
          {"token_logprobs", logprobs},
          {"top_logprobs", nullptr},
          {"text_offset", offsets}};
  }
  return {{"index", 0},
          {"text", text},
          {"logprobs", lp},
          {"finish_reason", reason ? json(reason) : json(nullptr)}};
}

void CompletionCall::send_event(const json& event) {
  if (!streaming_) {
    exchange_->start_stream("text/event-stream");
    streaming_ = true;
  }
  exchange_->send("data: " + json_text(event) + "\n\n");
}

void CompletionCall::on_tokens(TokenChunk chunk) {
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
    json body = envelope(json::array({choice(text_ + done.text_tail, ids_, logprobs_, reason)}));
    body["usage"] = usage_json(done.usage);
    return exchange_->reply(200, kJson, json_text(body));
  }
  if (done.status.ok()) {
    send_event(envelope(json::array({choice(done.text_tail, {}, {}, reason)})));
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
  ApiError e = api_error(status);
  exchange_->reply(e.http_status, kJson, json_text(e.body()));
}

}  // namespace fpa::server
