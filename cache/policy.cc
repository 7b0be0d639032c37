#include "cache/policy.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "absl/strings/str_cat.h"

namespace fpa::cache {

absl::StatusOr<Policy> parse_policy(std::string_view name) {
  for (Policy p : {Policy::kFpa, Policy::kNone, Policy::kWindow, Policy::kSinks, Policy::kH2O,
                   Policy::kSnapKV, Policy::kTova}) {
    if (policy_name(p) == name) return p;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown eviction policy \"", std::string(name),
                   "\" (expected fpa, none, window, sinks, h2o, snapkv or tova)"));
}

std::string_view policy_name(Policy p) {
  switch (p) {
    case Policy::kFpa:
      return "fpa";
    case Policy::kNone:
      return "none";
    case Policy::kWindow:
      return "window";
    case Policy::kSinks:
      return "sinks";
    case Policy::kH2O:
      return "h2o";
    case Policy::kSnapKV:
      return "snapkv";
    case Policy::kTova:
      return "tova";
  }
  return "unknown";
}

namespace {

absl::Status validate_snapkv(const PolicyConfig& policy) {
  if (policy.snapkv_window < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("snapkv: snapkv_window must be >= 1, got ", policy.snapkv_window));
  }
  if (policy.snapkv_pool < 1 || policy.snapkv_pool % 2 == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("snapkv: snapkv_pool must be odd and >= 1, got ", policy.snapkv_pool));
  }
  if (policy.prompt_tokens < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "snapkv: prompt_tokens (the prompt's length, set where the sequence starts) must be >= 1, "
        "got ",
        policy.prompt_tokens));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status validate_policy(const PolicyConfig& policy) {
  const std::string name(policy_name(policy.policy));
  if (name == "unknown") return absl::InvalidArgumentError("unknown eviction policy value");
  if (policy.policy == Policy::kFpa) {
    if (!(policy.tau > 0.0f)) {
      return absl::InvalidArgumentError(absl::StrCat("fpa: tau must be > 0, got ", policy.tau));
    }
    return absl::OkStatus();
  }
  if (policy.policy == Policy::kNone) return absl::OkStatus();
  if (!(policy.budget_fraction > 0.0f && policy.budget_fraction <= 1.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": budget_fraction must be in (0, 1], got ", policy.budget_fraction));
  }
  if (policy.min_budget < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": min_budget must be >= 1, got ", policy.min_budget));
  }
  if (policy.policy == Policy::kSinks &&
      (policy.sink_tokens < 0 || policy.sink_tokens >= policy.min_budget)) {
    return absl::InvalidArgumentError(
        absl::StrCat("sinks: sink_tokens must be in [0, min_budget=", policy.min_budget, "), got ",
                     policy.sink_tokens));
  }
  if (policy.policy == Policy::kH2O &&
      !(policy.h2o_recent_share >= 0.0f && policy.h2o_recent_share <= 1.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("h2o: h2o_recent_share must be in [0, 1], got ", policy.h2o_recent_share));
  }
  if (policy.policy == Policy::kSnapKV) return validate_snapkv(policy);
  return absl::OkStatus();
}

std::pair<int, int> MassRule::rows(int64_t start_pos, int len) const {
  if (mode == Mode::kNone) return {0, 0};
  const auto row = [&](int64_t pos) {
    return static_cast<int>(std::clamp<int64_t>(pos - start_pos, 0, len));
  };
  // last_query + 1 would overflow at its default (every query counts).
  const int end = last_query >= start_pos + len ? len : row(last_query + 1);
  const int first = row(first_query);
  return {first, std::max(first, end)};
}

int64_t budget_for_length(const PolicyConfig& policy, int64_t length) {
  const float share = policy.budget_fraction * static_cast<float>(length);
  return std::max<int64_t>(policy.min_budget, static_cast<int64_t>(std::ceil(share)));
}

int64_t h2o_recent_keys(const PolicyConfig& policy, int64_t budget) {
  const float share = policy.h2o_recent_share * static_cast<float>(budget);
  return std::clamp<int64_t>(static_cast<int64_t>(std::ceil(share)), 1,
                             std::max<int64_t>(1, budget));
}

}  // namespace fpa::cache
