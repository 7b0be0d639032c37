#include "cache/prefix_cache.h"

#include <algorithm>
#include <bit>

#include "absl/strings/str_cat.h"

namespace fpa::cache {
namespace {

// Every field that changes what a sequence keeps, floats by their bits: equal keys, equal
// states for equal prefixes. snapkv's state depends on where the prompt ends, so its prefixes
// serve only prompts of the same length (a preempted request resuming its own).
std::string policy_key(const PolicyConfig& p) {
  const int64_t prompt = p.policy == Policy::kSnapKV ? p.prompt_tokens : 0;
  return absl::StrCat(std::string(policy_name(p.policy)), "|", std::bit_cast<uint32_t>(p.tau), "|",
                      std::bit_cast<uint32_t>(p.budget_fraction), "|", p.min_budget, "|",
                      p.sink_tokens, "|", std::bit_cast<uint32_t>(p.h2o_recent_share), "|",
                      p.snapkv_window, "|", p.snapkv_pool, "|", prompt);
}

}  // namespace

struct PrefixCache::Node {
  std::vector<int32_t> edge;                          // tokens from the parent to here
  std::map<int32_t, std::unique_ptr<Node>> children;  // by the first token of their edge
  Node* parent = nullptr;
  int64_t depth = 0;  // tokens from the root through this node
  SeqId snapshot = -1;
  int64_t pages = 0;
  int64_t full_keys = 0;
  int64_t live_keys = 0;
  uint64_t used = 0;  // its key in lru_; 0 before the first use
  std::string key;    // a root's policy key
};

PrefixCache::PrefixCache(KvCache& cache, int64_t max_pages)
    : cache_(cache), max_pages_(max_pages) {}

PrefixCache::~PrefixCache() { flush(); }

// The deepest node on `tokens`' path that holds a snapshot, or with `exact` the node of exactly
// `tokens` (null when absent).
PrefixCache::Node* PrefixCache::find(std::span<const int32_t> tokens, const PolicyConfig& policy,
                                     bool exact) {
  auto root = roots_.find(policy_key(policy));
  if (root == roots_.end()) return nullptr;  // a lookup makes no tree: keys hold client bits
  Node* best = nullptr;
  for (Node* n = root->second.get(); n != nullptr;) {
    if (n->snapshot >= 0 && (!exact || n->depth == static_cast<int64_t>(tokens.size()))) best = n;
    if (n->depth >= static_cast<int64_t>(tokens.size())) break;
    auto it = n->children.find(tokens[static_cast<size_t>(n->depth)]);
    if (it == n->children.end()) break;
    Node* child = it->second.get();
    const auto rest = tokens.subspan(static_cast<size_t>(n->depth));
    if (rest.size() < child->edge.size() ||
        !std::equal(child->edge.begin(), child->edge.end(), rest.begin())) {
      break;
    }
    n = child;
  }
  return best;
}

std::optional<PrefixCache::Hit> PrefixCache::take(std::span<const int32_t> tokens,
                                                  const PolicyConfig& policy, bool count,
                                                  Match match) {
  if (count) queried_ += static_cast<int64_t>(tokens.size());
  Node* best = find(tokens, policy, /*exact=*/match == Match::kWhole);
  if (best == nullptr) return std::nullopt;
  absl::StatusOr<SeqId> seq = cache_.fork(best->snapshot);
  if (!seq.ok()) return std::nullopt;  // no room for the copy now: prefill instead
  touch(best);
  if (count) hits_ += best->depth;
  return Hit{*seq, best->depth};
}

void PrefixCache::forget(std::span<const int32_t> tokens, const PolicyConfig& policy) {
  if (Node* n = find(tokens, policy, /*exact=*/true)) drop(n);
}

// Room first, the branch after: reclaiming may drop a longer state on this very path and prune
// its branch, so no node of `tokens` may exist while snapshots are dropped.
bool PrefixCache::place(SeqId seq, std::span<const int32_t> tokens, const PolicyConfig& policy,
                        int64_t need, absl::FunctionRef<absl::StatusOr<SeqId>(SeqId)> make) {
  if (tokens.empty() || max_pages_ <= 0) return false;
  if (Node* cached = find(tokens, policy, /*exact=*/true)) {  // in use again
    touch(cached);
    return true;
  }
  while (pages_ + need > max_pages_ && reclaim_one()) {
  }
  if (pages_ + need > max_pages_) return false;
  std::lock_guard lock(held_mu_);
  absl::StatusOr<SeqId> snapshot = make(seq);
  if (!snapshot.ok()) return false;
  Node* n = insert(tokens, policy);
  n->snapshot = *snapshot;
  n->pages = need;
  const SequenceStats held = cache_.sequence_stats(*snapshot);
  n->full_keys = held.full_keys;
  n->live_keys = held.live_keys;
  touch(n);
  pages_ += need;
  full_keys_ += n->full_keys;
  live_keys_ += n->live_keys;
  ++snapshots_;
  return true;
}

bool PrefixCache::offer(SeqId seq, std::span<const int32_t> tokens, const PolicyConfig& policy) {
  return place(seq, tokens, policy, cache_.pages_to_fork(seq),
               [this](SeqId s) { return cache_.fork(s); });
}

bool PrefixCache::adopt(SeqId seq, std::span<const int32_t> tokens, const PolicyConfig& policy) {
  bool adopted = false;
  const bool cached = place(seq, tokens, policy, cache_.sequence_stats(seq).pages,
                            [&adopted](SeqId s) -> absl::StatusOr<SeqId> {
                              adopted = true;
                              return s;
                            });
  if (!adopted) cache_.release(seq);
  return cached;
}

// The node of exactly `tokens` in `policy`'s tree, made (splitting an edge where the tokens
// leave it) when absent.
PrefixCache::Node* PrefixCache::insert(std::span<const int32_t> tokens,
                                       const PolicyConfig& policy) {
  std::unique_ptr<Node>& r = roots_[policy_key(policy)];
  if (!r) {
    r = std::make_unique<Node>();
    r->key = policy_key(policy);
    trees_ = static_cast<int64_t>(roots_.size());
  }
  Node* n = r.get();
  for (size_t at = 0; at < tokens.size();) {
    std::unique_ptr<Node>& slot = n->children[tokens[at]];
    if (!slot) {  // a new leaf for the rest
      slot = std::make_unique<Node>();
      slot->edge.assign(tokens.begin() + static_cast<long>(at), tokens.end());
      slot->parent = n;
      slot->depth = static_cast<int64_t>(tokens.size());
      return slot.get();
    }
    const auto rest = tokens.subspan(at);
    const size_t common = static_cast<size_t>(
        std::mismatch(slot->edge.begin(), slot->edge.end(), rest.begin(), rest.end()).first -
        slot->edge.begin());
    if (common < slot->edge.size()) {  // split the edge where the tokens leave it
      auto mid = std::make_unique<Node>();
      mid->edge.assign(slot->edge.begin(), slot->edge.begin() + static_cast<long>(common));
      mid->parent = n;
      mid->depth = n->depth + static_cast<int64_t>(common);
      slot->edge.erase(slot->edge.begin(), slot->edge.begin() + static_cast<long>(common));
      slot->parent = mid.get();
      const int32_t first = slot->edge.front();
      mid->children[first] = std::move(slot);
      slot = std::move(mid);
    }
    n = slot.get();
    at += common;
  }
  return n;
}

void PrefixCache::touch(Node* n) {
  if (n->used != 0) lru_.erase(n->used);
  n->used = ++clock_;
  lru_[n->used] = n;
}

bool PrefixCache::reclaim_one() {
  if (lru_.empty()) return false;
  drop(lru_.begin()->second);
  ++evictions_;
  return true;
}

std::vector<int64_t> PrefixCache::reclaimable_pages() const {
  std::vector<int64_t> pages;
  pages.reserve(lru_.size());
  for (const auto& [used, node] : lru_) pages.push_back(node->pages);
  return pages;
}

// Releases the node's snapshot, then prunes the branches left with nothing to serve.
void PrefixCache::drop(Node* node) {
  if (node->snapshot >= 0) {
    std::lock_guard lock(held_mu_);
    cache_.release(node->snapshot);
    lru_.erase(node->used);
    node->snapshot = -1;
    pages_ -= node->pages;
    full_keys_ -= node->full_keys;
    live_keys_ -= node->live_keys;
    node->pages = 0;
    node->full_keys = 0;
    node->live_keys = 0;
    --snapshots_;
  }
  while (node->parent != nullptr && node->snapshot < 0 && node->children.empty()) {
    Node* parent = node->parent;
    parent->children.erase(node->edge.front());
    node = parent;
  }
  // An empty tree goes too: trees are keyed by client-chosen bits (tau, a prompt length), so
  // only trees holding a snapshot may stay, and those are bounded by the share.
  if (node->parent == nullptr && node->children.empty()) {
    roots_.erase(node->key);
    trees_ = static_cast<int64_t>(roots_.size());
  }
}

void PrefixCache::flush() {
  while (!lru_.empty()) drop(lru_.begin()->second);
  roots_.clear();
  trees_ = 0;
}

PrefixCacheStats PrefixCache::stats() const {
  return {snapshots_.load(), pages_.load(), queried_.load(),   hits_.load(),
          evictions_.load(), trees_.load(), full_keys_.load(), live_keys_.load()};
}

HeldStats PrefixCache::held() const {
  std::lock_guard lock(held_mu_);
  HeldStats h{cache_.stats(), stats()};
  h.running.sequences -= h.cached.snapshots;
  h.running.pages_in_use -= h.cached.pages;
  h.running.live_slots -= h.cached.live_keys;
  h.running.full_cache_keys -= h.cached.full_keys;
  return h;
}

HeldStats held_stats(const KvCache& pool, const PrefixCache* prefixes) {
  return prefixes != nullptr ? prefixes->held() : HeldStats{pool.stats(), {}};
}

}  // namespace fpa::cache
