#include "cache/eviction.h"

#include <algorithm>
#include <cmath>
#include <deque>
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

// Calls f(view, slot, gslot) for every live slot of the stream.
template <typename F>
void for_each_live(const PageTable& table, const Stream& stream, F f) {
  const int32_t slots = table.slots();
  for (int32_t page : stream.pages.pages) {
    const PageView v = table.view(page);
    for (int32_t s = 0; s < slots; ++s) {
      if (v.pos[s] >= 0) f(v, s, page * slots + s);
    }
  }
}

// A NaN mass would break the orderings below: it ranks as the heaviest.
float mass_of(const PageView& v, int32_t slot) {
  return std::isnan(v.acc[slot]) ? std::numeric_limits<float>::infinity() : v.acc[slot];
}

// h2o and tova: the lowest attention mass among keys older than the last `recent` positions dies
// first (ties: the older key).
std::vector<int32_t> lightest_keys(const PageTable& table, const Stream& stream, int64_t count,
                                   int32_t newest, int64_t recent) {
  if (count <= 0) return {};
  struct Candidate {
    float acc;
    int32_t pos;
    int32_t gslot;
  };
  std::vector<Candidate> candidates;
  for_each_live(table, stream, [&](const PageView& v, int32_t s, int32_t gslot) {
    if (v.pos[s] <= newest - recent) candidates.push_back({mass_of(v, s), v.pos[s], gslot});
  });
  count = std::clamp<int64_t>(count, 0, static_cast<int64_t>(candidates.size()));
  auto lighter = [](const Candidate& a, const Candidate& b) {
    return a.acc < b.acc || (a.acc == b.acc && a.pos < b.pos);
  };
  std::nth_element(candidates.begin(), candidates.begin() + count, candidates.end(), lighter);
  std::vector<int32_t> victims;
  for (int64_t i = 0; i < count; ++i) victims.push_back(candidates[static_cast<size_t>(i)].gslot);
  return victims;
}

// Pops the top of the stream's order into `dead` until at most `target` keys would remain.
void pop_to(Stream& stream, int64_t target, std::vector<int32_t>& dead) {
  while (stream.pages.live - static_cast<int64_t>(dead.size()) > target && !stream.order.empty()) {
    dead.push_back(stream.order.top().slot);
    stream.order.pop();
  }
}

// A heuristic's target for a decode step at `pos`: budget(pos + 1) with the key at pos, which is
// either in already (MassRule::kLast) or about to go in.
int64_t step_target(const PolicyConfig& policy, const Stream& stream, int32_t pos) {
  const int64_t budget = budget_for_length(policy, int64_t{pos} + 1);
  return stream.last_pos < pos ? budget - 1 : budget;
}

// out[i] = max of in[j] over |j - i| <= radius (SnapKV's max-pooling, padded with nothing), in
// one pass: `best` holds the indices of a decreasing run of the values in the window.
std::vector<float> max_pool(const std::vector<float>& in, int radius) {
  std::vector<float> out(in.size());
  std::deque<size_t> best;
  size_t next = 0;
  for (size_t i = 0; i < in.size(); ++i) {
    for (const size_t hi = std::min(in.size() - 1, i + radius); next <= hi; ++next) {
      while (!best.empty() && in[best.back()] <= in[next]) best.pop_back();
      best.push_back(next);
    }
    while (best.front() + radius < i) best.pop_front();
    out[i] = in[best.front()];
  }
  return out;
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

// The heuristics: a budget of live keys per head at each length, held by evict_to. The kernels
// never exclude keys for them.
class HeuristicRule : public EvictionRule {
 public:
  explicit HeuristicRule(const PolicyConfig& policy) : policy_(policy) {}

  float threshold(float) const override { return kInf; }
  bool kernels_exclude_evicted() const override { return false; }
  int evict_step(PageTable& table, Stream& stream, float, float, int32_t pos) override {
    return evict_to(table, stream, step_target(policy_, stream, pos), pos);
  }
  int evict_chunk(PageTable& table, Stream& stream, float, float, int32_t end_pos,
                  int32_t) override {
    return evict_to(table, stream, budget_for_length(policy_, int64_t{end_pos} + 1), end_pos);
  }

 protected:
  // Frees keys until at most `target` remain; `newest` is the position the budget is taken at.
  virtual int evict_to(PageTable& table, Stream& stream, int64_t target, int32_t newest) = 0;

  const PolicyConfig policy_;
};

// window, sinks (by age), h2o (by accumulated attention) and tova (by the last query's
// attention: every key, the newest too, competes).
class BudgetRule final : public HeuristicRule {
 public:
  using HeuristicRule::HeuristicRule;

  MassRule mass_rule() const override {
    if (policy_.policy == Policy::kH2O) return {.mode = MassRule::Mode::kAdd};
    if (policy_.policy == Policy::kTova) return {.mode = MassRule::Mode::kLast};
    return {};
  }
  void track(PageTable& table, Stream& stream, int32_t gslot) override {
    const int32_t pos = table.pos(gslot);
    if (!by_mass() && !(policy_.policy == Policy::kSinks && pos < policy_.sink_tokens)) {
      stream.order.push(-static_cast<double>(pos), gslot);
    }
  }

 private:
  int evict_to(PageTable& table, Stream& stream, int64_t target, int32_t newest) override {
    std::vector<int32_t>& dead = stream.scratch;
    dead.clear();
    if (by_mass()) {
      const int64_t budget = budget_for_length(policy_, int64_t{newest} + 1);
      const int64_t recent =
          policy_.policy == Policy::kH2O ? h2o_recent_keys(policy_, budget) : int64_t{0};
      dead = lightest_keys(table, stream, stream.pages.live - target, newest, recent);
    } else {
      pop_to(stream, target, dead);
    }
    table.free_slots(stream.pages, dead, true);
    return static_cast<int>(dead.size());
  }

  bool by_mass() const { return mass_rule().mode != MassRule::Mode::kNone; }
};

// SnapKV: the prompt is read whole before anything dies (as the paper compresses it once
// prefilled). At its end each prompt key before the observation window (the prompt's last
// snapkv_window positions) is scored by the attention the window's queries gave it, max-pooled
// over the snapkv_pool positions centred on it, and the scores stay fixed: those keys die lowest
// score first (older first on ties, as h2o). The window and the generated keys are kept; only
// when no scored key is left do they die too, oldest first, so that the stream still holds its
// budget.
class SnapKvRule final : public HeuristicRule {
 public:
  explicit SnapKvRule(const PolicyConfig& policy)
      : HeuristicRule(policy),
        scored_end_(std::max<int64_t>(0, policy.prompt_tokens - policy.snapkv_window)) {}

  MassRule mass_rule() const override {
    return {MassRule::Mode::kAdd, scored_end_, policy_.prompt_tokens - 1};
  }
  // The unscored keys wait in the order by age; the scored ones are picked by score.
  void track(PageTable& table, Stream& stream, int32_t gslot) override {
    const int32_t pos = table.pos(gslot);
    if (pos >= scored_end_) stream.order.push(-static_cast<double>(pos), gslot);
  }

 private:
  int evict_to(PageTable& table, Stream& stream, int64_t target, int32_t newest) override {
    if (newest < policy_.prompt_tokens - 1) return 0;
    if (!stream.scored) score_prompt(table, stream);
    std::vector<int32_t>& dead = stream.scratch;
    dead = lightest_keys(table, stream, stream.pages.live - target,
                         static_cast<int32_t>(scored_end_ - 1), 0);
    pop_to(stream, target, dead);
    table.free_slots(stream.pages, dead, true);
    return static_cast<int>(dead.size());
  }

  // Replaces each scored key's mass by its pooled score, once.
  void score_prompt(PageTable& table, Stream& stream) const {
    std::vector<float> mass(static_cast<size_t>(scored_end_), -kInf);  // by position
    for_each_live(table, stream, [&](const PageView& v, int32_t s, int32_t) {
      if (v.pos[s] < scored_end_) mass[static_cast<size_t>(v.pos[s])] = mass_of(v, s);
    });
    const std::vector<float> pooled = max_pool(mass, policy_.snapkv_pool / 2);
    for_each_live(table, stream, [&](const PageView& v, int32_t s, int32_t) {
      if (v.pos[s] < scored_end_) v.acc[s] = pooled[static_cast<size_t>(v.pos[s])];
    });
    stream.scored = true;
  }

  const int64_t scored_end_;  // prompt keys at positions below it are scored
};

}  // namespace

std::unique_ptr<EvictionRule> make_rule(const PolicyConfig& policy) {
  switch (policy.policy) {
    case Policy::kFpa:
      return std::make_unique<FpaRule>(policy);
    case Policy::kNone:
      return std::make_unique<KeepAllRule>();
    case Policy::kSnapKV:
      return std::make_unique<SnapKvRule>(policy);
    default:
      return std::make_unique<BudgetRule>(policy);
  }
}

bool chunks_replay_decode(const PolicyConfig& policy) {
  return make_rule(policy)->kernels_exclude_evicted();
}

}  // namespace fpa::cache
