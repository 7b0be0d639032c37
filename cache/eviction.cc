#include "cache/eviction.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "cache/policy.h"

namespace fpa::cache {
namespace {

bool sink(const PolicyConfig& policy, int32_t pos) {
  return policy.policy == Policy::kSinks && pos < policy.sink_tokens;
}

// Death by a key's own history: lvl - m >= threshold (false for m = +inf).
bool dead_by_own_minimum(const PageTable& table, int32_t gslot, float threshold) {
  return table.lvl(gslot) - table.m(gslot) >= threshold;
}

// Moves pending keys with pos <= `up_to` into the level order (or `dead`); the rest stay pending.
void flush_pending(PageTable& table, Stream& stream, float threshold, int32_t up_to,
                   std::vector<int32_t>& dead) {
  size_t kept = 0;
  for (int32_t gslot : stream.pending) {
    if (table.pos(gslot) > up_to) {
      table.where(gslot) = pending_where(kept);
      stream.pending[kept++] = gslot;
    } else if (dead_by_own_minimum(table, gslot, threshold)) {
      dead.push_back(gslot);
    } else {
      stream.order.push(table.lvl(gslot), gslot);
    }
  }
  stream.pending.resize(kept);
}

// Pops every key whose level lies at least `threshold` above `phi`. Float subtraction is monotone
// in lvl, so the keys meeting `lvl - phi >= threshold` are exactly a top segment of the heap.
void pop_above(Stream& stream, float phi, float threshold, std::vector<int32_t>& dead) {
  while (!stream.order.empty() && static_cast<float>(stream.order.top().key) - phi >= threshold) {
    dead.push_back(stream.order.top().slot);
    stream.order.pop();
  }
}

int evict_fpa(PageTable& table, Stream& stream, const PolicyConfig& policy, float phi, float beta,
              int32_t old_up_to) {
  // beta <= 0 (or NaN) never evicts: a NaN threshold fails every comparison, even for lvl = +inf.
  const float threshold = beta > 0.0f ? policy.tau / beta : std::numeric_limits<float>::quiet_NaN();
  std::vector<int32_t>& dead = stream.scratch;
  dead.clear();
  flush_pending(table, stream, threshold, old_up_to, dead);
  pop_above(stream, phi, threshold, dead);
  flush_pending(table, stream, threshold, std::numeric_limits<int32_t>::max(), dead);
  table.free_slots(stream.pages, dead, true);
  return static_cast<int>(dead.size());
}

// h2o: the lowest accumulated attention among keys older than the recent window dies first
// (ties: the older key).
std::vector<int32_t> h2o_victims(const PageTable& table, const Stream& stream, int64_t count,
                                 int32_t newest, int64_t recent) {
  if (count <= 0) return {};
  struct Candidate {
    float acc;
    int32_t pos;
    int32_t gslot;
  };
  std::vector<Candidate> candidates;
  const int32_t slots = table.slots();
  for (int32_t page : stream.pages.pages) {
    const PageView v = table.view(page);
    for (int32_t s = 0; s < slots; ++s) {
      if (v.pos[s] >= 0 && v.pos[s] <= newest - recent) {
        // A NaN mass would break nth_element's ordering: rank it as heaviest.
        const float acc = std::isnan(v.acc[s]) ? std::numeric_limits<float>::infinity() : v.acc[s];
        candidates.push_back({acc, v.pos[s], page * slots + s});
      }
    }
  }
  count = std::clamp<int64_t>(count, 0, static_cast<int64_t>(candidates.size()));
  auto lighter = [](const Candidate& a, const Candidate& b) {
    return a.acc < b.acc || (a.acc == b.acc && a.pos < b.pos);
  };
  std::nth_element(candidates.begin(), candidates.begin() + count, candidates.end(), lighter);
  std::vector<int32_t> victims;
  for (int64_t i = 0; i < count; ++i) victims.push_back(candidates[static_cast<size_t>(i)].gslot);
  return victims;
}

// Frees keys until at most `target` remain; `newest` is the position the budget is taken at.
int evict_to_budget(PageTable& table, Stream& stream, const PolicyConfig& policy, int64_t target,
                    int32_t newest) {
  std::vector<int32_t>& dead = stream.scratch;
  dead.clear();
  if (policy.policy == Policy::kH2O) {
    const int64_t budget = budget_for_length(policy, int64_t{newest} + 1);
    dead = h2o_victims(table, stream, stream.pages.live - target, newest,
                       h2o_recent_keys(policy, budget));
  } else {
    while (stream.pages.live - static_cast<int64_t>(dead.size()) > target &&
           !stream.order.empty()) {
      dead.push_back(stream.order.top().slot);
      stream.order.pop();
    }
  }
  table.free_slots(stream.pages, dead, true);
  return static_cast<int>(dead.size());
}

}  // namespace

void track_inserted(PageTable& table, Stream& stream, const PolicyConfig& policy, int32_t gslot) {
  const int32_t pos = table.pos(gslot);
  switch (policy.policy) {
    case Policy::kFpa:
      table.where(gslot) = pending_where(stream.pending.size());
      stream.pending.push_back(gslot);
      break;
    case Policy::kWindow:
    case Policy::kSinks:
      if (!sink(policy, pos)) stream.order.push(-static_cast<double>(pos), gslot);
      break;
    case Policy::kNone:
    case Policy::kH2O:
      break;
  }
}

int evict_step(PageTable& table, Stream& stream, const PolicyConfig& policy, float phi, float beta,
               int32_t pos) {
  stream.horizon = std::max(stream.horizon, pos);
  switch (policy.policy) {
    case Policy::kFpa:
      return evict_fpa(table, stream, policy, phi, beta, std::numeric_limits<int32_t>::max());
    case Policy::kNone:
      return 0;
    default:
      return evict_to_budget(table, stream, policy, budget_for_length(policy, int64_t{pos} + 1) - 1,
                             pos);
  }
}

int evict_chunk(PageTable& table, Stream& stream, const PolicyConfig& policy, float min_phi,
                float beta, int32_t end_pos) {
  const int32_t chunk_start = stream.horizon + 1;
  stream.horizon = std::max(stream.horizon, end_pos);
  switch (policy.policy) {
    case Policy::kFpa:
      return evict_fpa(table, stream, policy, min_phi, beta, chunk_start - 1);
    case Policy::kNone:
      return 0;
    default:
      return evict_to_budget(table, stream, policy, budget_for_length(policy, int64_t{end_pos} + 1),
                             end_pos);
  }
}

}  // namespace fpa::cache
