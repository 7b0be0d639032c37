#include "cache/eviction.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "cache/policy.h"

namespace fpa::cache {
namespace {

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

constexpr float kInf = std::numeric_limits<float>::infinity();

class FpaRule final : public EvictionRule {
 public:
  explicit FpaRule(const PolicyConfig& policy) : tau_(policy.tau) {}

  float threshold(float beta) const override { return beta > 0.0f ? tau_ / beta : kInf; }
  bool kernels_exclude_evicted() const override { return true; }
  void track(PageTable& table, Stream& stream, int32_t gslot) override {
    table.where(gslot) = pending_where(stream.pending.size());
    stream.pending.push_back(gslot);
  }
  int evict_step(PageTable& table, Stream& stream, float phi, float beta, int32_t) override {
    return evict(table, stream, phi, beta, std::numeric_limits<int32_t>::max());
  }
  int evict_chunk(PageTable& table, Stream& stream, float min_phi, float beta, int32_t,
                  int32_t horizon_before) override {
    return evict(table, stream, min_phi, beta, horizon_before);
  }

 private:
  // Pending keys up to `old_up_to` are judged against phi; later ones by their own minimum.
  int evict(PageTable& table, Stream& stream, float phi, float beta, int32_t old_up_to) {
    // beta <= 0 (or NaN) never evicts: a NaN threshold fails every comparison, even lvl = +inf.
    const float thr = beta > 0.0f ? tau_ / beta : std::numeric_limits<float>::quiet_NaN();
    std::vector<int32_t>& dead = stream.scratch;
    dead.clear();
    flush_pending(table, stream, thr, old_up_to, dead);
    pop_above(stream, phi, thr, dead);
    flush_pending(table, stream, thr, std::numeric_limits<int32_t>::max(), dead);
    table.free_slots(stream.pages, dead, true);
    return static_cast<int>(dead.size());
  }

  const float tau_;
};

class KeepAllRule final : public EvictionRule {
 public:
  float threshold(float) const override { return kInf; }
  bool kernels_exclude_evicted() const override { return true; }
  void track(PageTable&, Stream&, int32_t) override {}
  int evict_step(PageTable&, Stream&, float, float, int32_t) override { return 0; }
  int evict_chunk(PageTable&, Stream&, float, float, int32_t, int32_t) override { return 0; }
};

// A heuristic at a budget of live keys per head: window, sinks (by age) and h2o (by mass).
class BudgetRule final : public EvictionRule {
 public:
  explicit BudgetRule(const PolicyConfig& policy) : policy_(policy) {}

  float threshold(float) const override { return kInf; }
  bool kernels_exclude_evicted() const override { return false; }
  bool ranks_by_mass() const override { return policy_.policy == Policy::kH2O; }
  void track(PageTable& table, Stream& stream, int32_t gslot) override {
    const int32_t pos = table.pos(gslot);
    const bool by_age = policy_.policy != Policy::kH2O;
    if (by_age && !(policy_.policy == Policy::kSinks && pos < policy_.sink_tokens)) {
      stream.order.push(-static_cast<double>(pos), gslot);
    }
  }
  int evict_step(PageTable& table, Stream& stream, float, float, int32_t pos) override {
    return evict_to(table, stream, budget_for_length(policy_, int64_t{pos} + 1) - 1, pos);
  }
  int evict_chunk(PageTable& table, Stream& stream, float, float, int32_t end_pos,
                  int32_t) override {
    return evict_to(table, stream, budget_for_length(policy_, int64_t{end_pos} + 1), end_pos);
  }

 private:
  // Frees keys until at most `target` remain; `newest` is the position the budget is taken at.
  int evict_to(PageTable& table, Stream& stream, int64_t target, int32_t newest) {
    std::vector<int32_t>& dead = stream.scratch;
    dead.clear();
    if (policy_.policy == Policy::kH2O) {
      const int64_t budget = budget_for_length(policy_, int64_t{newest} + 1);
      dead = h2o_victims(table, stream, stream.pages.live - target, newest,
                         h2o_recent_keys(policy_, budget));
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

  const PolicyConfig policy_;
};

}  // namespace

std::unique_ptr<EvictionRule> make_rule(const PolicyConfig& policy) {
  switch (policy.policy) {
    case Policy::kFpa:
      return std::make_unique<FpaRule>(policy);
    case Policy::kNone:
      return std::make_unique<KeepAllRule>();
    default:
      return std::make_unique<BudgetRule>(policy);
  }
}

}  // namespace fpa::cache
