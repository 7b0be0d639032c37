#include "server/openai/openai_request.h"

#include <cstdint>
#include <functional>
#include <limits>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "model/json_depth.h"
#include "server/openai/chat_template.h"
#include "server/request/validate.h"

namespace fpa::server {
namespace {

using json = nlohmann::json;
using Setter = std::function<absl::Status(const json&, CompletionRequest&)>;

absl::Status bad(absl::string_view field, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", why));
}

bool is_int32(const json& v) {
  if (v.is_number_unsigned()) return v.get<uint64_t>() <= std::numeric_limits<int32_t>::max();
  if (!v.is_number_integer()) return false;
  int64_t x = v.get<int64_t>();
  return x >= std::numeric_limits<int32_t>::min() && x <= std::numeric_limits<int32_t>::max();
}

Setter int32_field(absl::string_view name, std::function<void(v1::GenerateRequest&, int32_t)> f) {
  return [name, f](const json& v, CompletionRequest& r) {
    if (!is_int32(v)) return bad(name, "must be a 32-bit integer");
    f(r.generate, v.get<int32_t>());
    return absl::OkStatus();
  };
}

Setter number_field(absl::string_view name, std::function<void(v1::GenerateRequest&, float)> f) {
  return [name, f](const json& v, CompletionRequest& r) {
    if (!v.is_number()) return bad(name, "must be a number");
    f(r.generate, v.get<float>());
    return absl::OkStatus();
  };
}

// A field the proto has no room for, accepted only at its neutral value.
Setter neutral_only(absl::string_view name, json neutral, absl::string_view why) {
  return [name, neutral, why](const json& v, CompletionRequest&) {
    return v == neutral ? absl::OkStatus() : bad(name, why);
  };
}

// One prompt: a string or an array of token ids.
absl::Status add_prompt(const json& v, CompletionRequest& r) {
  v1::GenerateRequest& p = r.prompts.emplace_back();
  if (v.is_string()) {
    p.set_text(v.get<std::string>());
    return absl::OkStatus();
  }
  auto* ids = p.mutable_tokens()->mutable_ids();
  for (const json& id : v) {
    if (!is_int32(id)) return bad("prompt", "must be a string or an array of token ids");
    ids->Add(id.get<int32_t>());
  }
  return absl::OkStatus();
}

// A prompt, or an array of prompts (strings, or arrays of token ids), as OpenAI's.
absl::Status set_prompt(const json& v, CompletionRequest& r) {
  if (!v.is_string() && !v.is_array()) {
    return bad("prompt", "must be a string, an array of token ids, or an array of those");
  }
  const bool batch = v.is_array() && !v.empty() && (v[0].is_string() || v[0].is_array());
  if (!batch) return add_prompt(v, r);
  for (const json& one : v) {
    if (!one.is_string() && !one.is_array()) {
      return bad("prompt", "a batch must hold only strings or only arrays of token ids");
    }
    if (absl::Status st = add_prompt(one, r); !st.ok()) return st;
  }
  return absl::OkStatus();
}

absl::Status set_n(const json& v, CompletionRequest& r) {
  if (!is_int32(v) || v.get<int32_t>() < 1 || v.get<int32_t>() > kMaxChoicesPerPrompt) {
    return bad("n", absl::StrCat("must be an integer in [1, ", kMaxChoicesPerPrompt, "]"));
  }
  r.n = v.get<int32_t>();
  return absl::OkStatus();
}

// An array of token ids; to_params checks them against the vocabulary.
Setter ids_field(absl::string_view name, std::function<void(v1::GenerateRequest&, int32_t)> add) {
  return [name, add](const json& v, CompletionRequest& r) {
    if (!v.is_array()) return bad(name, "must be an array of token ids");
    for (const json& id : v) {
      if (!is_int32(id)) return bad(name, "must be an array of token ids");
      add(r.generate, id.get<int32_t>());
    }
    return absl::OkStatus();
  };
}

// A string, or an array of strings.
Setter strings_field(absl::string_view name,
                     std::function<void(v1::GenerateRequest&, std::string)> add) {
  return [name, add](const json& v, CompletionRequest& r) {
    std::vector<json> items = v.is_array() ? v.get<std::vector<json>>() : std::vector<json>{v};
    for (const json& s : items) {
      if (!s.is_string()) return bad(name, "must be a string or an array of strings");
      add(r.generate, s.get<std::string>());
    }
    return absl::OkStatus();
  };
}

// logprobs: the number of alternatives per token beside the sampled one's log-probability
// (to_params checks the range); true, as chat's boolean arrives, is 0.
absl::Status set_logprobs(const json& v, CompletionRequest& r) {
  if (v.is_boolean()) {
    r.generate.set_logprobs(v.get<bool>());
  } else if (is_int32(v)) {
    r.generate.set_logprobs(true);
    r.generate.set_top_logprobs(v.get<int32_t>());
  } else {
    return bad("logprobs", "must be an integer (alternatives per token)");
  }
  return absl::OkStatus();
}

// OpenAI's map from token ids (as strings) to a bias; to_params checks ids and values.
absl::Status set_logit_bias(const json& v, CompletionRequest& r) {
  if (!v.is_object()) return bad("logit_bias", "must be an object of token id -> bias");
  for (const auto& [key, bias] : v.items()) {
    int32_t id = 0;
    if (!absl::SimpleAtoi(key, &id)) {
      return bad("logit_bias", absl::StrCat("key ", echo(key), " is not a token id"));
    }
    if (!bias.is_number()) return bad("logit_bias", "values must be numbers");
    (*r.generate.mutable_logit_bias())[id] = bias.get<float>();
  }
  return absl::OkStatus();
}

// vLLM's prompt_logprobs: the prompt's tokens scored, with this many alternatives each (to_params
// checks the range as prompt_top_logprobs).
absl::Status set_prompt_logprobs(const json& v, CompletionRequest& r) {
  if (!is_int32(v)) return bad("prompt_logprobs", "must be an integer (alternatives per token)");
  r.prompt_logprobs = v.get<int32_t>();
  r.generate.set_prompt_top_logprobs(v.get<int32_t>());
  return absl::OkStatus();
}

absl::Status set_seed(const json& v, CompletionRequest& r) {
  if (!v.is_number_integer() || (!v.is_number_unsigned() && v.get<int64_t>() < 0)) {
    return bad("seed", "must be an integer >= 0");
  }
  r.generate.set_seed(v.get<uint64_t>());
  return absl::OkStatus();
}

absl::Status set_stream_options(const json& v, CompletionRequest& r) {
  if (!v.is_object()) return bad("stream_options", "must be an object");
  for (const auto& [key, value] : v.items()) {
    if (key != "include_usage") {
      r.ignored.push_back("stream_options." + clip(key));
      continue;
    }
    if (!value.is_boolean()) return bad("stream_options.include_usage", "must be a boolean");
    r.include_usage = value.get<bool>();
  }
  return absl::OkStatus();
}

Setter bool_field(absl::string_view name, std::function<void(CompletionRequest&, bool)> f) {
  return [name, f](const json& v, CompletionRequest& r) {
    if (!v.is_boolean()) return bad(name, "must be a boolean");
    f(r, v.get<bool>());
    return absl::OkStatus();
  };
}

Setter text_field(absl::string_view name, std::function<void(CompletionRequest&, std::string)> f) {
  return [name, f](const json& v, CompletionRequest& r) {
    if (!v.is_string()) return bad(name, "must be a string");
    f(r, v.get<std::string>());
    return absl::OkStatus();
  };
}

const std::vector<std::pair<absl::string_view, Setter>>& fields() {
  using G = v1::GenerateRequest;
  static const std::vector<std::pair<absl::string_view, Setter>> kFields = {
      {"model", text_field("model", [](auto& r, std::string s) { r.model = std::move(s); })},
      {"prompt", set_prompt},
      {"max_tokens", int32_field("max_tokens", [](G& g, int32_t x) { g.set_max_new_tokens(x); })},
      {"temperature", number_field("temperature", [](G& g, float x) { g.set_temperature(x); })},
      {"top_p", number_field("top_p", [](G& g, float x) { g.set_top_p(x); })},
      // vLLM spells "off" -1; the proto spells it 0.
      {"top_k", int32_field("top_k", [](G& g, int32_t x) { g.set_top_k(x == -1 ? 0 : x); })},
      {"seed", set_seed},
      {"stop", strings_field("stop", [](G& g, std::string s) { g.add_stop(std::move(s)); })},
      {"stop_token_ids",
       ids_field("stop_token_ids", [](G& g, int32_t id) { g.add_stop_token_ids(id); })},
      {"allowed_token_ids",
       ids_field("allowed_token_ids", [](G& g, int32_t id) { g.add_allowed_token_ids(id); })},
      {"bad_words",
       strings_field("bad_words", [](G& g, std::string s) { g.add_bad_words(std::move(s)); })},
      {"include_stop_str_in_output",
       bool_field("include_stop_str_in_output", [](auto& r, bool b) { r.include_stop = b; })},
      {"logprobs", set_logprobs},
      {"stream", bool_field("stream", [](auto& r, bool b) { r.stream = b; })},
      {"stream_options", set_stream_options},
      {"ignore_eos",
       bool_field("ignore_eos", [](auto& r, bool b) { r.generate.set_ignore_eos(b); })},
      {"eviction_policy",
       text_field("eviction_policy",
                  [](auto& r, std::string s) { r.generate.set_eviction_policy(s); })},
      {"tau", number_field("tau", [](G& g, float x) { g.set_tau(x); })},
      {"cache_budget_fraction",
       number_field("cache_budget_fraction",
                    [](G& g, float x) { g.set_cache_budget_fraction(x); })},
      {"sink_tokens", int32_field("sink_tokens", [](G& g, int32_t x) { g.set_sink_tokens(x); })},
      {"snapkv_window",
       int32_field("snapkv_window", [](G& g, int32_t x) { g.set_snapkv_window(x); })},
      {"snapkv_pool", int32_field("snapkv_pool", [](G& g, int32_t x) { g.set_snapkv_pool(x); })},
      {"user", text_field("user", [](auto&, std::string) {})},  // for the client's own accounting
      {"n", set_n},
      {"best_of", neutral_only("best_of", 1, "only 1")},
      {"echo", bool_field("echo", [](auto& r, bool b) { r.echo = b; })},
      {"prompt_logprobs", set_prompt_logprobs},
      {"use_beam_search", neutral_only("use_beam_search", false, "beam search is not implemented")},
      {"length_penalty", neutral_only("length_penalty", 1,
                                      "only 1 (it weighs beams; beam search is not implemented)")},
      {"presence_penalty",
       number_field("presence_penalty", [](G& g, float x) { g.set_presence_penalty(x); })},
      {"frequency_penalty",
       number_field("frequency_penalty", [](G& g, float x) { g.set_frequency_penalty(x); })},
      {"repetition_penalty",
       number_field("repetition_penalty", [](G& g, float x) { g.set_repetition_penalty(x); })},
      {"min_p", number_field("min_p", [](G& g, float x) { g.set_min_p(x); })},
      {"min_tokens", int32_field("min_tokens", [](G& g, int32_t x) { g.set_min_tokens(x); })},
      {"logit_bias", set_logit_bias},
  };
  return kFields;
}

// to_params names the proto's fields; these are the OpenAI names of the renamed ones.
absl::string_view openai_name(absl::string_view proto_field) {
  if (proto_field == "text" || proto_field == "tokens.ids") return "prompt";
  if (proto_field == "max_new_tokens") return "max_tokens";
  if (proto_field == "top_logprobs") return "logprobs";  // chat's top_logprobs arrives as it
  if (proto_field == "prompt_top_logprobs") return "prompt_logprobs";
  return proto_field;
}

absl::string_view type_of(int http_status) {
  if (http_status == 429) return "rate_limit_error";
  return http_status >= 500 ? "server_error" : "invalid_request_error";
}

}  // namespace

v1::GenerateRequest CompletionRequest::for_prompt(size_t i) const {
  v1::GenerateRequest one = generate;
  one.MergeFrom(prompts[i]);
  return one;
}

absl::StatusOr<CompletionRequest> parse_completion_request(const json& body, int max_tokens) {
  if (!body.is_object()) return bad("body", "must be a JSON object");
  CompletionRequest r;
  r.generate.set_max_new_tokens(max_tokens);
  r.generate.set_temperature(kOpenAiDefaultTemperature);
  for (const auto& [key, value] : body.items()) {
    if (value.is_null()) continue;  // null = the default, as OpenAI's clients send it
    const Setter* set = nullptr;
    for (const auto& [name, setter] : fields()) {
      if (name == key) set = &setter;
    }
    if (set == nullptr) {
      r.ignored.push_back(clip(key));
      continue;
    }
    if (absl::Status st = (*set)(value, r); !st.ok()) return st;
  }
  if (r.prompts.empty()) return bad("prompt", "is required");
  if (r.prompts.size() * static_cast<size_t>(r.n) > kMaxChoices) {
    return bad("prompt", absl::StrCat(r.prompts.size(), " prompts x n = ", r.n,
                                      " choices, more than ", kMaxChoices));
  }
  // The echoed prompt comes from the scheduler with its scores (lm-evaluation-harness's
  // loglikelihood reads them), and then max_tokens may be 0.
  r.generate.set_prompt_logprobs(r.echo || r.prompt_logprobs.has_value());
  return r;
}

absl::StatusOr<json> parse_json_body(std::string_view text) {
  if (!json_depth_within(text)) {
    return bad("body", absl::StrCat("nested deeper than ", kMaxJsonDepth, " levels"));
  }
  json body = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (body.is_discarded()) return bad("body", "not valid JSON");
  return body;
}

absl::StatusOr<CompletionRequest> parse_completion_body(std::string_view text, bool chat,
                                                        const RequestLimits& limits) {
  absl::StatusOr<json> body = parse_json_body(text);
  if (body.ok() && chat) body = chat_to_completion(*body, *limits.tokenizer);
  if (!body.ok()) return body.status();
  return parse_completion_request(*body, chat ? limits.max_new_tokens : kOpenAiDefaultMaxTokens);
}

std::string json_text(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

nlohmann::json ApiError::body() const {
  json param_json = param ? json(*param) : json(nullptr);
  return {{"error", {{"message", message}, {"type", type}, {"param", param_json}, {"code", code}}}};
}

ApiError api_error(int http_status, absl::string_view code, std::string message) {
  return {http_status, std::move(message), std::string(type_of(http_status)), std::nullopt,
          std::string(code)};
}

ApiError api_error(const absl::Status& status) {
  std::string message(status.message());
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument: {
      ApiError e = api_error(400, "invalid_value", message);
      if (size_t colon = message.find(": "); colon != std::string::npos) {
        std::string field(openai_name(message.substr(0, colon)));
        e.message = absl::StrCat(field, message.substr(colon));
        e.param = field;
      }
      return e;
    }
    case absl::StatusCode::kResourceExhausted:
      return api_error(429, "resource_exhausted", message);
    case absl::StatusCode::kUnavailable:
      return api_error(503, "unavailable", message);
    case absl::StatusCode::kDeadlineExceeded:
      return api_error(504, "deadline_exceeded", message);
    case absl::StatusCode::kUnimplemented:
      return api_error(501, "unimplemented", message);
    default:
      return api_error(500, "internal_error", message);
  }
}

}  // namespace fpa::server
