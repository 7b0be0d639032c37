#include "server/request/validate.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "cache/policy.h"

namespace fpa::server {
namespace {

absl::Status bad(absl::string_view field, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", why));
}

size_t echo_end(absl::string_view value) {
  if (value.size() <= kMaxEchoBytes) return value.size();
  size_t end = kMaxEchoBytes;
  while (end > 0 && (static_cast<unsigned char>(value[end]) & 0xC0) == 0x80) --end;
  return end;
}

}  // namespace

std::string clip(absl::string_view value) {
  size_t end = echo_end(value);
  if (end == value.size()) return std::string(value);
  return absl::StrCat(value.substr(0, end), "... (", value.size(), " bytes)");
}

std::string echo(absl::string_view value) {
  size_t end = echo_end(value);
  if (end == value.size()) return absl::StrCat("'", value, "'");
  return absl::StrCat("'", value.substr(0, end), "...' (", value.size(), " bytes)");
}

namespace {

absl::StatusOr<std::vector<int32_t>> prompt_of(const v1::GenerateRequest& req,
                                               const RequestLimits& limits) {
  std::vector<int32_t> prompt;
  if (req.has_tokens()) {
    prompt.assign(req.tokens().ids().begin(), req.tokens().ids().end());
    for (size_t i = 0; i < prompt.size(); ++i) {
      if (prompt[i] < 0 || prompt[i] >= limits.vocab_size) {
        return bad("tokens.ids",
                   absl::StrCat("id ", prompt[i], " at index ", i,
                                " is outside the vocabulary [0, ", limits.vocab_size, ")"));
      }
    }
    if (prompt.empty()) return bad("tokens.ids", "the prompt is empty");
  } else {
    if (req.text().empty()) return bad("text", "the prompt is empty (set text or tokens)");
    prompt = limits.tokenizer->encode(req.text());
  }
  if (static_cast<int64_t>(prompt.size()) > limits.max_prompt_tokens) {
    return bad(req.has_tokens() ? "tokens.ids" : "text",
               absl::StrCat("the prompt has ", prompt.size(), " tokens, more than the server's ",
                            "limit of ", limits.max_prompt_tokens, " (--max-prompt-tokens)"));
  }
  return prompt;
}

absl::Status check_vocabulary_id(absl::string_view field, int32_t id, const RequestLimits& limits) {
  if (id >= 0 && id < limits.vocab_size) return absl::OkStatus();
  return bad(field,
             absl::StrCat("id ", id, " is outside the vocabulary [0, ", limits.vocab_size, ")"));
}

absl::Status check_sampling(const v1::GenerateRequest& req, GenerationParams& p) {
  if (!std::isfinite(req.temperature()) || req.temperature() < 0) {
    return bad("temperature", absl::StrCat(req.temperature(), " must be a finite number >= 0"));
  }
  if (req.top_k() < 0) return bad("top_k", absl::StrCat(req.top_k(), " must be >= 0 (0 = off)"));
  if (req.has_top_p() && !(req.top_p() > 0 && req.top_p() <= 1)) {
    return bad("top_p", absl::StrCat(req.top_p(), " must be in (0, 1]"));
  }
  p.sampling.temperature = req.temperature();
  p.sampling.top_k = req.top_k();
  p.sampling.top_p = req.has_top_p() ? req.top_p() : 1.0f;
  p.sampling.seed = req.seed();
  return absl::OkStatus();
}

inline constexpr int kMaxTopLogprobs = 20;      // vLLM's default --max-logprobs is 20
inline constexpr float kMaxLogitBias = 100.0f;  // OpenAI's range

bool within(float x, float lo, float hi) { return std::isfinite(x) && x >= lo && x <= hi; }

// vLLM's sampling fields, with vLLM's ranges.
absl::Status check_penalties(const v1::GenerateRequest& req, const RequestLimits& limits,
                             GenerationParams& p) {
  LogitRules& r = p.sampling.rules;
  r.repetition_penalty = req.has_repetition_penalty() ? req.repetition_penalty() : 1.0f;
  if (!(std::isfinite(r.repetition_penalty) && r.repetition_penalty > 0)) {
    return bad("repetition_penalty", absl::StrCat(r.repetition_penalty, " must be > 0"));
  }
  if (!within(req.presence_penalty(), -2, 2)) {
    return bad("presence_penalty", absl::StrCat(req.presence_penalty(), " must be in [-2, 2]"));
  }
  if (!within(req.frequency_penalty(), -2, 2)) {
    return bad("frequency_penalty", absl::StrCat(req.frequency_penalty(), " must be in [-2, 2]"));
  }
  r.presence_penalty = req.presence_penalty();
  r.frequency_penalty = req.frequency_penalty();
  for (const auto& [id, bias] : req.logit_bias()) {
    if (absl::Status st = check_vocabulary_id("logit_bias", id, limits); !st.ok()) return st;
    if (!within(bias, -kMaxLogitBias, kMaxLogitBias)) {
      return bad("logit_bias",
                 absl::StrCat("bias ", bias, " of id ", id, " must be in [-100, 100]"));
    }
    r.logit_bias.emplace_back(id, bias);
  }
  std::ranges::sort(r.logit_bias);  // a map's order is unspecified: the same request, same rules
  return absl::OkStatus();
}

absl::Status check_filters(const v1::GenerateRequest& req, GenerationParams& p) {
  if (!within(req.min_p(), 0, 1)) {
    return bad("min_p", absl::StrCat(req.min_p(), " must be in [0, 1]"));
  }
  p.sampling.min_p = req.min_p();
  if (req.top_logprobs() < 0 || req.top_logprobs() > kMaxTopLogprobs) {
    return bad("top_logprobs",
               absl::StrCat(req.top_logprobs(), " must be in [0, ", kMaxTopLogprobs, "]"));
  }
  p.sampling.top_logprobs = req.top_logprobs();
  if (req.prompt_top_logprobs() < 0 || req.prompt_top_logprobs() > kMaxTopLogprobs) {
    return bad("prompt_top_logprobs",
               absl::StrCat(req.prompt_top_logprobs(), " must be in [0, ", kMaxTopLogprobs, "]"));
  }
  p.prompt_top_logprobs = std::max(req.prompt_top_logprobs(), req.top_logprobs());
  if (req.min_tokens() < 0 || req.min_tokens() > p.max_new_tokens) {
    return bad(
        "min_tokens",
        absl::StrCat(req.min_tokens(), " must be in [0, max_new_tokens = ", p.max_new_tokens, "]"));
  }
  p.sampling.rules.min_tokens = req.min_tokens();
  return absl::OkStatus();
}

// A bad word as vLLM encodes it: as the text's start, and after a space where that gives as
// many ids (a byte-level BPE's " word" is one id where "word" is one; a longer spelling would
// ban a different word's pieces).
void add_bad_word(absl::string_view word, const Tokenizer& tokenizer, LogitRules& r) {
  word = absl::StripLeadingAsciiWhitespace(word);
  std::vector<int32_t> alone = encode_without_bos({word.data(), word.size()}, tokenizer);
  std::vector<int32_t> spaced = encode_without_bos(absl::StrCat(" ", word), tokenizer);
  if (alone.empty()) return;  // a tokenizer that spells the word with no id cannot produce it
  const bool both = spaced.size() == alone.size() && spaced[0] != alone[0];
  r.bad_words.push_back(std::move(alone));
  if (both) r.bad_words.push_back(std::move(spaced));
}

absl::Status check_masks(const v1::GenerateRequest& req, const RequestLimits& limits,
                         GenerationParams& p) {
  LogitRules& r = p.sampling.rules;
  for (int32_t id : req.allowed_token_ids()) {
    if (absl::Status st = check_vocabulary_id("allowed_token_ids", id, limits); !st.ok()) return st;
    r.allowed_ids.push_back(id);
  }
  std::ranges::sort(r.allowed_ids);
  r.allowed_ids.erase(std::unique(r.allowed_ids.begin(), r.allowed_ids.end()), r.allowed_ids.end());
  if (req.bad_words_size() > kMaxBadWords) {
    return bad("bad_words", absl::StrCat(req.bad_words_size(), " words, at most ", kMaxBadWords));
  }
  for (int i = 0; i < req.bad_words_size(); ++i) {
    const std::string& word = req.bad_words(i);
    if (absl::StripLeadingAsciiWhitespace(word).empty() || word.size() > kMaxStopBytes) {
      return bad("bad_words", absl::StrCat("word ", i, " must have 1 to ", kMaxStopBytes,
                                           " bytes other than leading spaces"));
    }
    add_bad_word(word, *limits.tokenizer, r);
  }
  return absl::OkStatus();
}

absl::Status check_stop(const v1::GenerateRequest& req, const RequestLimits& limits,
                        GenerationParams& p) {
  if (req.stop_size() > kMaxStopSequences) {
    return bad("stop", absl::StrCat(req.stop_size(), " sequences, at most ", kMaxStopSequences));
  }
  for (int i = 0; i < req.stop_size(); ++i) {
    const std::string& s = req.stop(i);
    if (s.empty() || s.size() > kMaxStopBytes) {
      return bad("stop", absl::StrCat("sequence ", i, " must have 1 to ", kMaxStopBytes, " bytes"));
    }
    p.stop.push_back(s);
  }
  for (int32_t id : req.stop_token_ids()) {
    if (absl::Status st = check_vocabulary_id("stop_token_ids", id, limits); !st.ok()) return st;
    p.stop_token_ids.push_back(id);
  }
  return absl::OkStatus();
}

// snapkv's fields, and the prompt's length it needs (set here, where the prompt is known).
absl::Status check_snapkv(const v1::GenerateRequest& req, GenerationParams& p) {
  cache::PolicyConfig& c = p.policy;
  if (req.has_snapkv_window()) {
    if (req.snapkv_window() < 1) {
      return bad("snapkv_window", absl::StrCat(req.snapkv_window(), " must be >= 1"));
    }
    c.snapkv_window = req.snapkv_window();
  }
  if (req.has_snapkv_pool()) {
    if (req.snapkv_pool() < 1 || req.snapkv_pool() % 2 == 0) {
      return bad("snapkv_pool", absl::StrCat(req.snapkv_pool(), " must be odd and >= 1"));
    }
    c.snapkv_pool = req.snapkv_pool();
  }
  c.prompt_tokens = static_cast<int64_t>(p.prompt.size());
  return cache::validate_policy(c);
}

absl::Status check_policy(const v1::GenerateRequest& req, const RequestLimits& limits,
                          GenerationParams& p) {
  cache::PolicyConfig& c = p.policy;
  if (!req.eviction_policy().empty()) {
    absl::StatusOr<cache::Policy> policy = cache::parse_policy(req.eviction_policy());
    if (!policy.ok()) {
      return bad("eviction_policy", absl::StrCat("unknown policy ", echo(req.eviction_policy()),
                                                 " (fpa, none, window, sinks, h2o, snapkv, tova)"));
    }
    c.policy = *policy;
  }
  c.tau = limits.default_tau;
  if (req.has_tau()) {
    if (!std::isfinite(req.tau()) || req.tau() <= 0) {
      return bad("tau", absl::StrCat(req.tau(), " must be a finite number > 0"));
    }
    c.tau = req.tau();
  }
  if (req.has_cache_budget_fraction()) {
    float f = req.cache_budget_fraction();
    if (!(f > 0 && f <= 1))
      return bad("cache_budget_fraction", absl::StrCat(f, " must be in (0, 1]"));
    c.budget_fraction = f;
  }
  if (req.has_sink_tokens()) {
    if (req.sink_tokens() < 0) {
      return bad("sink_tokens", absl::StrCat(req.sink_tokens(), " must be >= 0"));
    }
    c.sink_tokens = req.sink_tokens();
  }
  // The sinks are part of the smallest budget (cache::validate_policy): checked here, where the
  // request enters, so that the error names the field.
  if (c.policy == cache::Policy::kSinks && c.sink_tokens >= c.min_budget) {
    return bad("sink_tokens", absl::StrCat(c.sink_tokens, " must be < ", c.min_budget,
                                           " (the smallest cache budget) for sinks"));
  }
  return check_snapkv(req, p);
}

}  // namespace

absl::StatusOr<GenerationParams> to_params(const v1::GenerateRequest& req,
                                           const RequestLimits& limits) {
  GenerationParams p;
  absl::StatusOr<std::vector<int32_t>> prompt = prompt_of(req, limits);
  if (!prompt.ok()) return prompt.status();
  p.prompt = std::move(*prompt);
  p.max_new_tokens = req.has_max_new_tokens() ? req.max_new_tokens() : kDefaultMaxNewTokens;
  // Scoring a prompt needs no new token (lm-evaluation-harness's loglikelihood).
  p.prompt_logprobs = req.prompt_logprobs();
  const int least = p.prompt_logprobs ? 0 : 1;
  if (p.max_new_tokens < least || p.max_new_tokens > limits.max_new_tokens) {
    return bad("max_new_tokens", absl::StrCat(req.max_new_tokens(), " is out of range [", least,
                                              ", ", limits.max_new_tokens, "] (--max-new-tokens)"));
  }
  if (absl::Status st = check_sampling(req, p); !st.ok()) return st;
  if (absl::Status st = check_penalties(req, limits, p); !st.ok()) return st;
  if (absl::Status st = check_filters(req, p); !st.ok()) return st;
  if (absl::Status st = check_stop(req, limits, p); !st.ok()) return st;
  if (absl::Status st = check_masks(req, limits, p); !st.ok()) return st;
  if (absl::Status st = check_policy(req, limits, p); !st.ok()) return st;
  p.logprobs = req.logprobs();
  p.ignore_eos = req.ignore_eos();
  return p;
}

}  // namespace fpa::server
