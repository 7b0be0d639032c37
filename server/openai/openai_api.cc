#include "server/openai/openai_api.h"

#include <chrono>
#include <iostream>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "server/http/api_key.h"
#include "server/metrics/metrics_http.h"
#include "server/openai/openai_completion.h"
#include "server/openai/openai_request.h"
#include "server/openai/openai_tokenize.h"
#include "server/request/validate.h"

namespace fpa::server {
namespace {

using json = nlohmann::json;

constexpr const char* kJson = "application/json";

// As vLLM does, unknown fields are ignored with a warning; the header (fpa-serve's own) lets
// the client see which, where a misspelt field would otherwise pass unnoticed.
void report_ignored(http::Exchange& exchange, const std::vector<std::string>& fields) {
  // The names are the client's bytes: no control characters into a header, and not unbounded.
  constexpr size_t kMaxBytes = 1024;
  std::string names = absl::StrJoin(fields, ", ").substr(0, kMaxBytes);
  for (char& c : names) {
    if (c < 0x20 || c > 0x7e) c = '?';
  }
  std::cerr << "fpa-serve: warning: these fields were present in the request but ignored: " << names
            << "\n";
  exchange.add_header(std::string(kIgnoredFieldsHeader), names);
}

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

OpenAiApi::OpenAiApi(Scheduler& scheduler, ServerMetrics& metrics, OpenAiInfo info)
    : scheduler_(scheduler),
      metrics_(metrics),
      collectable_(metrics.collectable()),
      info_(std::move(info)),
      created_(unix_now()),
      id_prefix_(std::random_device{}()),
      next_seed_(std::random_device{}()) {}

http::Handler OpenAiApi::handler() {
  return [this](std::shared_ptr<http::Exchange> exchange) { route(std::move(exchange)); };
}

void OpenAiApi::route(std::shared_ptr<http::Exchange> exchange) {
  const http::Request& r = exchange->request();
  if (serve_metrics(*exchange, *collectable_)) return;
  std::string path = r.target.substr(0, r.target.find('?'));
  const bool chat = path == "/v1/chat/completions";
  const bool tokens = path == "/tokenize" || path == "/detokenize";
  const char* method = path == "/v1/completions" || chat || tokens ? "POST"
                       : path == "/v1/models" || path == "/health" ? "GET"
                                                                   : nullptr;
  if (method == nullptr) {
    return reply_error(*exchange,
                       api_error(404, "not_found", absl::StrCat(clip(path), ": not found")));
  }
  if (r.method != method) {
    return reply_error(*exchange, api_error(405, "method_not_allowed",
                                            absl::StrCat(clip(path), ": only ", method)));
  }
  // As vLLM's --api-key: probes and scrapers need no key.
  if (path != "/health" && !info_.api_key.empty() &&
      !bearer_matches(r.authorization, info_.api_key)) {
    return reply_error(*exchange, api_error(401, "invalid_api_key",
                                            "Authorization: a wrong or missing Bearer key"));
  }
  if (path == "/health") {
    return exchange->reply(draining_ ? 503 : 200, "text/plain; charset=utf-8", "");
  }
  if (path == "/v1/models") return models(*exchange);
  if (tokens) return tokenizer_call(*exchange, path == "/tokenize");
  completions(std::move(exchange), chat);
}

void OpenAiApi::models(http::Exchange& exchange) const {
  json model = {{"id", info_.model_name},
                {"object", "model"},
                {"created", created_},
                {"owned_by", "fpa-serve"},
                {"max_model_len", info_.limits.max_prompt_tokens},
                {"attention", info_.attention},
                {"tokenizer", info_.limits.tokenizer->kind()}};
  if (!info_.formats.weights.empty()) {
    model["cpu_weights"] = info_.formats.weights;
    model["kv_dtype"] = info_.formats.kv;
  }
  exchange.reply(200, kJson, json_text(json{{"object", "list"}, {"data", json::array({model})}}));
}

void OpenAiApi::tokenizer_call(http::Exchange& exchange, bool encode) const {
  absl::StatusOr<json> body = parse_json_body(exchange.request().body);
  absl::StatusOr<json> answer = !body.ok() ? body
                                : encode   ? tokenize(*body, info_.limits)
                                           : detokenize(*body, info_.limits);
  if (!answer.ok()) return reply_error(exchange, api_error(answer.status()));
  exchange.reply(200, kJson, json_text(*answer));
}

// One scheduler request per choice: each prompt validated, then n samples of it. A seeded
// request's choice j samples with seed + j (as vLLM's), an unseeded one's with fresh seeds.
// TODO(issue 24): the n samples each prefill the prompt. The prefix cache does not share it: the
// prompt's snapshot holds every prompt token and a sample needs the last one's logits; keeping
// those logits with the snapshot would save n - 1 prefills (and serve a repeated prompt).
absl::StatusOr<std::vector<std::shared_ptr<Request>>> OpenAiApi::choices_of(
    const CompletionRequest& req) {
  std::vector<std::shared_ptr<Request>> out;
  for (size_t i = 0; i < req.prompts.size(); ++i) {
    absl::StatusOr<GenerationParams> params = to_params(req.for_prompt(i), info_.limits);
    if (!params.ok()) return params.status();
    for (int j = 0; j < req.n; ++j) {
      auto request = std::make_shared<Request>();
      request->params = *params;
      request->params.sampling.seed =
          req.generate.has_seed() ? req.generate.seed() + j : next_seed_++;
      out.push_back(std::move(request));
    }
  }
  return out;
}

void OpenAiApi::completions(std::shared_ptr<http::Exchange> exchange, bool chat) {
  auto refuse = [&](const absl::Status& st) {
    metrics_.count_request(static_cast<int>(st.code()));
    reply_error(*exchange, api_error(st));
  };
  absl::StatusOr<CompletionRequest> req =
      parse_completion_body(exchange->request().body, chat, info_.limits);
  if (!req.ok()) return refuse(req.status());
  if (!req->ignored.empty()) report_ignored(*exchange, req->ignored);
  if (req->model && *req->model != info_.model_name) {
    metrics_.count_request(static_cast<int>(absl::StatusCode::kNotFound));
    ApiError e = api_error(404, "model_not_found",
                           absl::StrCat("model: ", echo(*req->model), " is not served here ('",
                                        info_.model_name, "' is)"));
    e.param = "model";
    return reply_error(*exchange, e);
  }
  absl::StatusOr<std::vector<std::shared_ptr<Request>>> requests = choices_of(*req);
  if (!requests.ok()) return refuse(requests.status());
  const GenerationParams& params = requests->front()->params;
  CompletionMeta meta{
      absl::StrCat(chat ? "chatcmpl-" : "cmpl-",
                   absl::StrFormat("%08x%08x", id_prefix_ & 0xffffffff, next_id_++)),
      info_.model_name,
      unix_now(),
      req->stream,
      req->include_usage,
      req->generate.logprobs(),
      req->generate.top_logprobs(),
      req->echo,
      chat,
      params.stop,
      req->include_stop,
      params.stop_token_ids,
      info_.limits.tokenizer,
      req->n,
      req->prompt_logprobs};
  std::make_shared<CompletionCall>(std::move(exchange), std::move(meta), metrics_)
      ->start(scheduler_, std::move(*requests));
}

}  // namespace fpa::server
