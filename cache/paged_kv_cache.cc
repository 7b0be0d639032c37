// KvCache: sequences and their streams over one PageTable.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <memory>
#include <shared_mutex>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "cache/eviction.h"
#include "cache/kv_cache.h"
#include "cache/page_table.h"
#include "cache/policy.h"
#include "cache/stream.h"

namespace fpa::cache {

int64_t CacheStats::bytes_held() const { return pages_in_use * page_slots * bytes_per_key; }
int64_t CacheStats::bytes_full() const { return full_cache_keys * bytes_per_key; }

double SequenceStats::live_fraction() const {
  return full_keys > 0 ? static_cast<double>(live_keys) / static_cast<double>(full_keys) : 0.0;
}

// A sequence: its streams, its eviction rule and its counters.
struct SequenceState {
  PolicyConfig policy;
  std::unique_ptr<EvictionRule> rule;
  int64_t reserved = 0;  // pages held back for its next step; changed under the ledger's lock
  std::vector<Stream> streams;  // layer-major: layer * n_heads + head
  // Readable while the sequence runs, hence atomics.
  std::atomic<int64_t> length{0};
  std::atomic<int64_t> live{0};
  std::atomic<int64_t> peak{0};
  std::atomic<int64_t> pages{0};
};

namespace {

void raise_to(std::atomic<int64_t>& value, int64_t candidate) {
  int64_t current = value.load(std::memory_order_relaxed);
  while (candidate > current && !value.compare_exchange_weak(current, candidate)) {
  }
}

// Carries a stream's change in live keys and pages to its sequence's counters.
class SequenceAccount {
 public:
  SequenceAccount(SequenceState& seq, const Stream& stream)
      : seq_(seq),
        stream_(stream),
        live_(stream.pages.live),
        pages_(static_cast<int64_t>(stream.pages.pages.size())) {}
  ~SequenceAccount() {
    const int64_t live =
        seq_.live.fetch_add(stream_.pages.live - live_) + (stream_.pages.live - live_);
    seq_.pages.fetch_add(static_cast<int64_t>(stream_.pages.pages.size()) - pages_);
    raise_to(seq_.peak, live);
  }
  SequenceAccount(const SequenceAccount&) = delete;
  SequenceAccount& operator=(const SequenceAccount&) = delete;

 private:
  SequenceState& seq_;
  const Stream& stream_;
  const int64_t live_;
  const int64_t pages_;
};

// KvCache::prefetch's steps for one stream.
void prefetch_stream(const PageTable& table, const Stream& stream, int step) {
  if (step == 0) {
    const char* record = reinterpret_cast<const char*>(&stream);
    for (size_t at = 0; at < sizeof(Stream); at += 64) __builtin_prefetch(record + at);
  } else if (step == 1) {
    if (!stream.pending.empty()) __builtin_prefetch(stream.pending.data());
    for (const std::vector<int32_t>* list : {&stream.pages.nonfull, &stream.pages.pages}) {
      if (!list->empty()) __builtin_prefetch(&list->back());
    }
    if (!stream.order.empty()) __builtin_prefetch(&stream.order.top());
  } else {
    for (int32_t gslot : stream.pending) table.prefetch_slot(gslot);
    if (!stream.pages.nonfull.empty()) table.prefetch_page(stream.pages.nonfull.back());
  }
}

class PagedKvCache final : public KvCache {
 public:
  PagedKvCache(CacheShape shape, std::unique_ptr<PageTable> table)
      : shape_(shape), table_(std::move(table)) {}

  const CacheShape& shape() const override { return shape_; }

  absl::StatusOr<SeqId> add_sequence(const PolicyConfig& policy) override {
    if (absl::Status s = validate_policy(policy); !s.ok()) return s;
    auto seq = std::make_unique<SequenceState>();
    seq->policy = policy;
    seq->rule = make_rule(policy);
    const int streams = shape_.n_layers * shape_.n_heads;
    seq->streams.reserve(static_cast<size_t>(streams));
    for (int i = 0; i < streams; ++i) seq->streams.emplace_back(table_->where_data());
    std::unique_lock lock(mu_);
    const SeqId id = next_id_++;
    sequences_.emplace(id, std::move(seq));
    table_->ledger().apply({.sequences = 1});
    return id;
  }

  int64_t pages_to_fork(SeqId id) const override {
    std::shared_lock lock(mu_);
    const SequenceState* seq = find(id);
    if (seq == nullptr) return 0;
    int64_t pages = 0;
    for (const Stream& stream : seq->streams) {
      pages += (stream.pages.live + shape_.page_slots - 1) / shape_.page_slots;
    }
    return pages;
  }

  absl::StatusOr<SeqId> fork(SeqId id) override {
    if (!contains(id)) return absl::NotFoundError(absl::StrCat("fork: unknown sequence ", id));
    const absl::StatusOr<DevicePool*> device = edit_device();
    if (!device.ok()) {
      return absl::FailedPreconditionError(absl::StrCat("fork: ", device.status().message()));
    }
    if (pages_to_fork(id) > free_pages()) {
      return absl::ResourceExhaustedError(absl::StrCat("fork: sequence ", id, " needs ",
                                                       pages_to_fork(id), " pages, ", free_pages(),
                                                       " are free"));
    }
    absl::StatusOr<SeqId> copy = add_sequence(policy(id));
    if (!copy.ok()) return copy.status();
    std::vector<SlotCopy> copies;
    std::vector<int32_t> pages;
    absl::Status copied;
    {
      std::shared_lock lock(mu_);
      const SequenceState& from = *find(id);
      SequenceState& to = *sequences_.at(*copy);
      for (size_t i = 0; i < from.streams.size() && copied.ok(); ++i) {
        copied = copy_stream(from.streams[i], to, to.streams[i], copies);
        pages.insert(pages.end(), to.streams[i].pages.pages.begin(),
                     to.streams[i].pages.pages.end());
      }
      to.length = from.length.load();
      settle_streams(to, 0, static_cast<int>(to.streams.size()));
    }
    if (copied.ok() && *device != nullptr) copied = (*device)->copy_slots(pages, copies);
    if (!copied.ok()) {  // another thread took pages meanwhile: nothing of the copy stays
      release(*copy);
      return copied;
    }
    if (fork_listener_) fork_listener_(id, *copy);
    return *copy;
  }

  void attach_device(DevicePool* device) override { device_ = device; }
  absl::StatusOr<DevicePool*> edit_device() const override {
    if (device_ == nullptr && !table_->host_storage()) {
      return absl::FailedPreconditionError(
          "the keys and values live on a device, and no device is attached to send the edits to "
          "(KvCache::attach_device)");
    }
    return device_;
  }
  void on_fork(std::function<void(SeqId from, SeqId to)> listener) override {
    fork_listener_ = std::move(listener);
  }

  void release(SeqId id) override {
    std::unique_ptr<SequenceState> seq;
    {
      std::unique_lock lock(mu_);
      auto it = sequences_.find(id);
      if (it == sequences_.end()) return;
      seq = std::move(it->second);
      sequences_.erase(it);
    }
    for (Stream& stream : seq->streams) {
      stream.order.clear();
      for (int32_t gslot : stream.pending) table_->where(gslot) = -1;
      table_->release(stream.pages, int64_t{stream.last_pos} + 1);
    }
    table_->ledger().unreserve(&seq->reserved);
    table_->ledger().apply({.sequences = -1});
  }

  const PolicyConfig& policy(SeqId id) const override {
    static const PolicyConfig kUnknown{};
    std::shared_lock lock(mu_);
    auto it = sequences_.find(id);
    return it == sequences_.end() ? kUnknown : it->second->policy;
  }

  int64_t pages_needed(SeqId id, int n_tokens) const override {
    std::shared_lock lock(mu_);
    return pages_needed(find(id), n_tokens);
  }

  bool reserve(SeqId id, int n_tokens) override {
    std::shared_lock lock(mu_);
    SequenceState* seq = const_cast<SequenceState*>(find(id));
    if (seq == nullptr) return false;
    return table_->ledger().reserve(&seq->reserved, pages_needed(seq, n_tokens));
  }

  void unreserve(SeqId id) override {
    std::shared_lock lock(mu_);
    SequenceState* seq = const_cast<SequenceState*>(find(id));
    if (seq != nullptr) table_->ledger().unreserve(&seq->reserved);
  }

  bool contains(SeqId id) const override {
    std::shared_lock lock(mu_);
    return find(id) != nullptr;
  }

  int64_t length(SeqId id) const override {
    std::shared_lock lock(mu_);
    const SequenceState* seq = find(id);
    return seq == nullptr ? 0 : seq->length.load();
  }

  float threshold(SeqId id, float beta) const override {
    std::shared_lock lock(mu_);
    const SequenceState* seq = find(id);
    return seq == nullptr ? std::numeric_limits<float>::infinity() : seq->rule->threshold(beta);
  }

  MassRule mass_rule(SeqId id) const override {
    std::shared_lock lock(mu_);
    const SequenceState* seq = find(id);
    return seq == nullptr ? MassRule{} : seq->rule->mass_rule();
  }

  int64_t free_pages() const override { return table_->ledger().free_pages(); }

  SeqRef resolve(SeqId id) const override {
    std::shared_lock lock(mu_);
    return ref_of(id);
  }

  int evict_for_step(SeqRef ref, int layer, int head, float phi, float beta, int32_t pos) override {
    auto [seq, stream] = locate(ref, layer, head);
    if (stream == nullptr) return 0;
    SequenceAccount account(*seq, *stream);
    stream->horizon = std::max(stream->horizon, pos);
    return seq->rule->evict_step(*table_, *stream, phi, beta, pos);
  }

  int evict_for_chunk(SeqRef ref, int layer, int head, float min_phi_chunk, float beta,
                      int32_t chunk_end_pos) override {
    auto [seq, stream] = locate(ref, layer, head);
    if (stream == nullptr) return 0;
    SequenceAccount account(*seq, *stream);
    const int32_t before = stream->horizon;
    stream->horizon = std::max(before, chunk_end_pos);
    return seq->rule->evict_chunk(*table_, *stream, min_phi_chunk, beta, chunk_end_pos, before);
  }

  absl::StatusOr<SlotRef> insert(SeqRef ref, int layer, int head, int32_t pos, float lvl,
                                 const float* k, const float* v, float m) override {
    auto [seq, stream] = locate(ref, layer, head);
    if (stream == nullptr) return not_found(ref, layer, head);
    if (pos <= stream->last_pos) {
      return absl::InvalidArgumentError(
          absl::StrCat("insert: position ", pos, " after ", stream->last_pos, " (must increase)"));
    }
    if (std::isnan(lvl) || std::isnan(m)) {
      return absl::InvalidArgumentError(absl::StrCat("insert: NaN level or minimum at ", pos));
    }
    if (table_->host_storage() && (k == nullptr || v == nullptr)) {
      return absl::InvalidArgumentError("insert: k and v are required with host storage");
    }
    SequenceAccount account(*seq, *stream);
    absl::StatusOr<int32_t> gslot =
        table_->take_slot(stream->pages, layer, pos - stream->last_pos, &seq->reserved);
    if (!gslot.ok()) return gslot.status();
    table_->write_slot(*gslot, pos, lvl, m, k, v);
    seq->rule->track(*table_, *stream, *gslot);
    stream->last_pos = pos;
    raise_to(seq->length, int64_t{pos} + 1);
    return SlotRef{*gslot / shape_.page_slots, *gslot % shape_.page_slots};
  }

  void settle(SeqRef ref, int layer, int first_head, int heads) override {
    SequenceState* seq = locate(ref, layer, first_head).first;
    if (seq == nullptr || heads > shape_.n_heads - first_head) return;
    settle_streams(*seq, layer * shape_.n_heads + first_head, heads);
  }

  void count_dropped(int64_t keys) override {
    if (keys > 0) table_->ledger().apply({.evicted = keys});
  }

  float last_phi(SeqId id, int layer, int head) const override {
    std::shared_lock lock(mu_);
    const Stream* stream = locate(id, layer, head).second;
    return stream == nullptr ? 0.0f : stream->last_phi;
  }

  void set_last_phi(SeqRef ref, int layer, int head, float phi) override {
    if (Stream* stream = locate(ref, layer, head).second) stream->last_phi = phi;
  }

  std::span<const int32_t> pages(SeqId id, int layer, int head) const override {
    std::shared_lock lock(mu_);
    const Stream* stream = locate(id, layer, head).second;
    if (stream == nullptr) return {};
    return stream->pages.pages;
  }

  void prefetch(SeqRef ref, int layer, int head, int step) const override {
    if (const Stream* stream = locate(ref, layer, head).second) {
      prefetch_stream(*table_, *stream, step);
    }
  }

  PageView page(int32_t page_id) override {
    if (page_id < 0 || page_id >= table_->num_pages()) return PageView{};
    return table_->view(page_id);
  }

  const PageLayout& layout() const override { return table_->layout(); }

  int compact(SeqRef ref, int layer, int head,
              const std::function<void(SlotRef from, SlotRef to)>& on_move) override {
    auto [seq, stream] = locate(ref, layer, head);
    if (stream == nullptr) return 0;
    SequenceAccount account(*seq, *stream);
    const int32_t slots = shape_.page_slots;
    return table_->compact(stream->pages, [&](int32_t from, int32_t to) {
      const int32_t where = table_->where(from);
      if (where >= 0) {
        stream->order.relocate(where, to);
      } else if (where <= -2) {
        stream->pending[static_cast<size_t>(-2 - where)] = to;
        table_->where(to) = where;
      }
      if (on_move) on_move({from / slots, from % slots}, {to / slots, to % slots});
    });
  }

  CacheStats stats() const override {
    CacheStats s = table_->ledger().snapshot();
    s.page_slots = shape_.page_slots;
    return s;
  }

  SequenceStats sequence_stats(SeqId id) const override {
    std::shared_lock lock(mu_);
    const SequenceState* seq = find(id);
    if (seq == nullptr) return {};
    SequenceStats s;
    s.length = seq->length.load();
    s.live_keys = seq->live.load();
    s.peak_live_keys = seq->peak.load();
    s.pages = seq->pages.load();
    s.full_keys = s.length * shape_.n_layers * shape_.n_heads;
    return s;
  }

 private:
  // Re-inserts a stream's live keys into an empty one (the rule orders them as new keys; each
  // is alive by its own minimum, so the next eviction call judges them as the source's order
  // would) and carries its position, horizon and last phi.
  // Copies `from`'s live keys into `to`, each copy (source, target slot) appended to `copies`.
  absl::Status copy_stream(const Stream& from, SequenceState& seq, Stream& to,
                           std::vector<SlotCopy>& copies) {
    SequenceAccount account(seq, to);
    const int32_t slots = shape_.page_slots;
    for (int32_t page : from.pages.pages) {
      const PageView v = table_->view(page);
      for (int32_t s = 0; s < slots; ++s) {
        if (v.pos[s] < 0) continue;
        absl::StatusOr<int32_t> gslot = table_->clone_slot(to.pages, page * slots + s);
        if (!gslot.ok()) return gslot.status();
        copies.push_back({page * slots + s, *gslot});
        seq.rule->track(*table_, to, *gslot);
      }
    }
    to.last_pos = from.last_pos;
    to.horizon = from.horizon;
    to.last_phi = from.last_phi;
    to.scored = from.scored;
    table_->ledger().apply({.full_keys = int64_t{from.last_pos} + 1});
    return absl::OkStatus();
  }

  // Streams [first, first + count) of the sequence (layer-major): their unsettled counters go
  // to the ledger as one change.
  void settle_streams(SequenceState& seq, int first, int count) {
    LedgerDelta delta;
    for (int i = first; i < first + count; ++i) {
      LedgerDelta& unsettled = seq.streams[static_cast<size_t>(i)].pages.unsettled;
      delta += unsettled;
      unsettled = {};
    }
    if (!delta.empty()) table_->ledger().apply(delta);
  }

  int64_t pages_needed(const SequenceState* seq, int n_tokens) const {
    if (seq == nullptr || n_tokens <= 0) return 0;
    const int64_t slots = shape_.page_slots;
    int64_t pages = 0;
    for (const Stream& stream : seq->streams) {
      const int64_t free =
          static_cast<int64_t>(stream.pages.pages.size()) * slots - stream.pages.live;
      const int64_t missing = std::max<int64_t>(0, n_tokens - free);
      pages += (missing + slots - 1) / slots;
    }
    return pages;
  }

  const SequenceState* find(SeqId id) const {
    auto it = sequences_.find(id);
    return it == sequences_.end() ? nullptr : it->second.get();
  }

  // Under mu_ (shared).
  SeqRef ref_of(SeqId id) const { return {const_cast<SequenceState*>(find(id)), id}; }

  // Under mu_ (shared) for an id; a resolved sequence needs no lock.
  std::pair<SequenceState*, Stream*> locate(SeqId id, int layer, int head) const {
    return locate(ref_of(id), layer, head);
  }
  std::pair<SequenceState*, Stream*> locate(SeqRef ref, int layer, int head) const {
    if (ref.state == nullptr || layer < 0 || layer >= shape_.n_layers || head < 0 ||
        head >= shape_.n_heads) {
      return {nullptr, nullptr};
    }
    return {ref.state, &ref.state->streams[static_cast<size_t>(layer * shape_.n_heads + head)]};
  }

  absl::Status not_found(SeqRef ref, int layer, int head) const {
    if (ref.state != nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("no stream layer ", layer, " head ", head,
                                                     " in a cache of ", shape_.n_layers,
                                                     " layers x ", shape_.n_heads, " heads"));
    }
    return absl::NotFoundError(absl::StrCat("unknown sequence ", ref.id));
  }

  const CacheShape shape_;
  std::unique_ptr<PageTable> table_;
  DevicePool* device_ = nullptr;  // where every slot edit goes (KvCache::attach_device)
  std::function<void(SeqId from, SeqId to)> fork_listener_;
  mutable std::shared_mutex mu_;  // guards sequences_ (the map, not the sequences' streams)
  absl::flat_hash_map<SeqId, std::unique_ptr<SequenceState>> sequences_;
  SeqId next_id_ = 1;
};

absl::Status validate_shape(const CacheShape& shape, int64_t num_pages) {
  if (shape.n_layers < 1 || shape.n_heads < 1 || shape.head_dim < 1 || shape.page_slots < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cache shape needs positive sizes, got layers=", shape.n_layers, " heads=", shape.n_heads,
        " head_dim=", shape.head_dim, " page_slots=", shape.page_slots));
  }
  if (shape.kv_bytes != 4 && shape.kv_bytes != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("cache kv_bytes must be 4 (float32) or 2 (bf16), got ", shape.kv_bytes));
  }
  constexpr int64_t kMaxSlots = int64_t{1} << 31;
  if (num_pages < 1 || num_pages * shape.page_slots >= kMaxSlots) {
    return absl::InvalidArgumentError(absl::StrCat("cache needs 1 to ", kMaxSlots - 1,
                                                   " slots in all, got ", num_pages, " pages of ",
                                                   shape.page_slots));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<KvCache>> KvCache::create(CacheShape shape, int64_t num_pages,
                                                         bool host_storage) {
  if (absl::Status s = validate_shape(shape, num_pages); !s.ok()) return s;
  absl::StatusOr<std::unique_ptr<PageTable>> table =
      PageTable::create(shape, num_pages, host_storage);
  if (!table.ok()) return table.status();
  return std::unique_ptr<KvCache>(new PagedKvCache(shape, *std::move(table)));
}

int64_t KvCache::pages_for_bytes(CacheShape shape, int64_t bytes, bool host_storage) {
  if (validate_shape(shape, 1).ok() && bytes > 0) {
    return bytes / (shape.page_slots * bytes_per_key(shape, host_storage));
  }
  return 0;
}

int64_t KvCache::bytes_per_key(const CacheShape& shape, bool host_storage) {
  return PageTable::bytes_per_key(shape, host_storage);
}

}  // namespace fpa::cache
