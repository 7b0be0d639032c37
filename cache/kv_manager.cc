#include "cache/kv_manager.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "cache/eviction.h"

namespace fpa::cache {

KvRequest::KvRequest(const PolicyConfig& p, int64_t prompt, int64_t max_new)
    : policy(p), prompt_tokens(prompt), max_new_tokens(max_new), replay_chunks(true) {
  policy.prompt_tokens = prompt;
  replay_chunks = chunks_replay_decode(policy);
}

KvManager::KvManager(KvCache& cache, KvManagerOptions options)
    : cache_(cache), options_(std::move(options)) {
  if (options_.prefix_cache_share > 0) {
    const auto pages = static_cast<int64_t>(options_.prefix_cache_share *
                                            static_cast<double>(cache_.stats().pages_total));
    prefix_ = std::make_unique<PrefixCache>(cache_, pages);
  }
}

KvManager::~KvManager() { flush(); }

// Pages a new sequence's first `tokens` keys take: every stream opens its own pages.
int64_t KvManager::pages_for_new(int64_t tokens) const {
  const CacheShape& s = cache_.shape();
  const int64_t per_stream = (tokens + s.page_slots - 1) / s.page_slots;
  return int64_t{s.n_layers} * s.n_heads * per_stream;
}

absl::Status KvManager::check_fits_alone(const KvRequest& r) const {
  const int64_t total = cache_.stats().pages_total;
  // Every prompt and output token but the last, which no step feeds back.
  const int64_t keys = r.prompt_tokens + r.max_new_tokens - 1;
  if (r.policy.policy == Policy::kNone && pages_for_new(keys) > total) {
    return absl::ResourceExhaustedError(
        absl::StrCat("max_new_tokens: with eviction_policy none, ", keys, " cached tokens need ",
                     pages_for_new(keys), " KV cache pages, the whole pool has ", total, " (",
                     options_.pool_flag, ")"));
  }
  return absl::OkStatus();
}

// Pages a request may still take before admission can count on them: under `none`, whose need
// is exact, every page up to its last token; under the others, where eviction decides, its next
// step's worst case.
int64_t KvManager::pages_ahead(const KvRequest& r) const {
  if (r.policy.policy == Policy::kNone) {
    const int64_t held = r.seq >= 0 ? cache_.sequence_stats(r.seq).pages : 0;
    return std::max<int64_t>(0, pages_for_new(r.prompt_tokens + r.max_new_tokens - 1) - held);
  }
  return r.seq >= 0 ? cache_.pages_needed(r.seq, static_cast<int>(r.next_tokens))
                    : pages_for_new(r.next_tokens);
}

// An empty batch takes the head of the queue regardless: alone, the planner shrinks its chunks to
// the pool, or it fails.
bool KvManager::can_admit(const KvRequest& r) const {
  if (running_.empty()) return true;
  const CacheShape& shape = cache_.shape();
  Admission q{
      .ahead_pages = pages_ahead(r),
      .high_water_pages = r.high_water_pages,
      .streams = int64_t{shape.n_layers} * shape.n_heads,
      .watermark = static_cast<int64_t>(options_.watermark *
                                        static_cast<double>(cache_.stats().pages_total)),
      .free_pages = cache_.free_pages(),
      .reclaimable_pages = reclaimable_pages(),
  };
  for (const KvRequest* running : running_) q.running_ahead += pages_ahead(*running);
  return admits(q);
}

// Where chunks do not replay decode, a state equals a cold run's only if built by the same prompt
// chunks: such a request resumes from its own prompt's state and takes no other.
// TODO(issue 23): snapshots at chunk boundaries would let those rules share prompt prefixes.
absl::StatusOr<int64_t> KvManager::admit(KvRequest& r, const AdmitQuery& q) {
  int64_t cached = 0;
  if (prefix_ && !q.scoring && (r.replay_chunks || q.resume)) {
    const auto prompt = static_cast<size_t>(r.prompt_tokens);
    // Before a decode step: the prompt but its last token, or after a preemption every token but
    // the last sampled one (which that step feeds); by chunks only where they replay decode.
    const size_t limit = !q.resume ? prompt - 1 : r.replay_chunks ? q.context.size() - 1 : prompt;
    const auto match =
        r.replay_chunks ? PrefixCache::Match::kLongestPrefix : PrefixCache::Match::kWhole;
    if (auto hit = prefix_->take(q.context.first(limit), r.policy, q.count, match)) {
      r.seq = hit->seq;
      cached = hit->tokens;
    }
  }
  if (r.seq < 0) {
    absl::StatusOr<SeqId> seq = cache_.add_sequence(r.policy);
    if (!seq.ok()) return seq.status();
    r.seq = *seq;
  }
  running_.push_back(&r);
  return cached;
}

bool KvManager::offer(const KvRequest& r, std::span<const int32_t> tokens) {
  return prefix_ && r.seq >= 0 && !tokens.empty() && prefix_->offer(r.seq, tokens, r.policy);
}

ReservedStep KvManager::reserve_step(std::span<const StepAsk> asks, int64_t prefill_budget) {
  std::vector<PlanEntry> entries;
  entries.reserve(asks.size());
  for (const StepAsk& ask : asks) {
    const SeqId seq = ask.request->seq;
    entries.push_back({.prefilling = ask.prefilling,
                       .tokens = ask.tokens,
                       .preemptions = ask.preemptions,
                       .held_pages = cache_.sequence_stats(seq).pages,
                       .pages_needed = [this, seq](int64_t n) {
                         return cache_.pages_needed(seq, static_cast<int>(n));
                       }});
  }
  const PoolState pool{
      .free_pages = cache_.free_pages(),
      .snapshot_pages = prefix_ ? prefix_->reclaimable_pages() : std::vector<int64_t>{}};
  ReservedStep out{.plan = plan_step(pool, entries, prefill_budget), .broken = {}};
  // In the plan's order: what it counted free is free before anything is reserved.
  for (size_t i = 0; i < out.plan.snapshots_reclaimed; ++i) prefix_->reclaim_one();
  for (const size_t v : out.plan.preempted) preempt(*asks[v].request);
  for (const size_t f : out.plan.failed) release(*asks[f].request);
  for (const StepPlan::Item& item : out.plan.items) {
    if (!cache_.reserve(asks[item.entry].request->seq, static_cast<int>(item.tokens))) {
      out.broken.push_back(item.entry);
    }
  }
  return out;
}

void KvManager::preempt(KvRequest& r) {
  if (r.seq >= 0) {
    r.high_water_pages = std::max(r.high_water_pages, cache_.sequence_stats(r.seq).pages);
  }
  release(r);
}

// The final state supersedes the prompt's: a conversation's next turn extends it. Not where
// chunks do not replay decode: a run that prefills those tokens would compute another state.
void KvManager::finish(KvRequest& r, std::span<const int32_t> tokens, bool cache_state) {
  if (r.seq < 0) return;
  if (!prefix_ || !cache_state || !r.replay_chunks ||
      static_cast<int64_t>(tokens.size()) <= r.prompt_tokens) {
    release(r);
    return;
  }
  std::erase(running_, &r);
  const SeqId seq = std::exchange(r.seq, -1);
  if (prefix_->adopt(seq, tokens, r.policy)) {
    prefix_->forget(tokens.first(static_cast<size_t>(r.prompt_tokens)), r.policy);
  }
}

void KvManager::release(KvRequest& r) {
  if (r.seq < 0) return;
  std::erase(running_, &r);
  cache_.release(std::exchange(r.seq, -1));
}

int64_t KvManager::reclaimable_pages() const { return prefix_ ? prefix_->stats().pages : 0; }

SequenceStats KvManager::sequence_stats(const KvRequest& r) const {
  return r.seq >= 0 ? cache_.sequence_stats(r.seq) : SequenceStats{};
}

void KvManager::flush() {
  if (prefix_) prefix_->flush();
}

}  // namespace fpa::cache
