// Policy arithmetic shared by the cache and its tests: validation and per-length budgets.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "cache/kv_cache.h"

namespace fpa::cache {

// InvalidArgument naming the bad field: tau > 0 (fpa), budget_fraction in (0, 1],
// min_budget >= 1, 0 <= sink_tokens < min_budget (sinks), h2o_recent_share in [0, 1],
// snapkv_window >= 1, snapkv_pool odd and >= 1, prompt_tokens >= 1 (snapkv).
absl::Status validate_policy(const PolicyConfig& policy);

// Live keys per head a heuristic policy keeps at sequence length `length`:
// max(min_budget, ceil(budget_fraction * length)), the product taken in float.
int64_t budget_for_length(const PolicyConfig& policy, int64_t length);

// Keys of an h2o budget kept as the recent window: ceil(h2o_recent_share * budget) in [1, budget].
int64_t h2o_recent_keys(const PolicyConfig& policy, int64_t budget);

}  // namespace fpa::cache
