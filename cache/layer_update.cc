#include "cache/layer_update.h"

#include <algorithm>
#include <limits>
#include <utility>

namespace fpa::cache {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

}  // namespace

// The one place a step's stream edits are made (StreamEditor names it its friend), and the one
// place they leave for the device: collected as they are made, sent once the layer is done (not
// collected where no device takes them: the CPU backend's pool is the host's own).
class LayerWriter {
 public:
  LayerWriter(KvCache& cache, int layer, const LayerRows& rows)
      : cache_(cache), layer_(layer), rows_(rows), device_(cache.edit_device()) {}

  // Checked before any edit: a device-resident pool with no device must not change at all.
  absl::Status device_status() const { return device_.status(); }
  // Whether the edits go to a device, which takes them in the layer's one order.
  bool sends() const { return device_.ok() && *device_ != nullptr; }
  void send() const {
    if (sends()) (*device_)->apply(layer_, out_);
  }

  float at(const float* values, int row, int head) const {
    return values[row * rows_.row_stride + head * rows_.head_stride];
  }

  // One key of row `row` at `pos`, running minimum `m`.
  absl::Status insert(SeqRef seq, int head, int row, int32_t pos, float m) {
    const size_t pages_before = sends() ? cache_.pages(seq.id, layer_, head).size() : 0;
    const float lvl = at(rows_.lvl, row, head);
    const long kv = row * rows_.kv_stride + static_cast<long>(head) * cache_.shape().head_dim;
    absl::StatusOr<SlotRef> slot =
        cache_.insert(seq, layer_, head, pos, lvl, rows_.k ? rows_.k + kv : nullptr,
                      rows_.v ? rows_.v + kv : nullptr, m);
    if (!slot.ok()) return slot.status();
    if (sends() && cache_.pages(seq.id, layer_, head).size() > pages_before) {
      out_.reset_pages.push_back(slot->page);
    }
    if (rows_.acc != nullptr && rows_.k != nullptr) {
      cache_.page(slot->page).acc[slot->slot] = at(rows_.acc, row, head);
    }
    if (sends()) {
      out_.writes.push_back(
          KeyWrite{slot->page * cache_.shape().page_slots + slot->slot, row, head, pos, lvl, m});
    }
    return absl::OkStatus();
  }

  // A decode token: evict at its phi, then insert it. When keys are ranked by the current
  // query's attention alone (MassRule::kLast: tova), the new key has its score already and
  // competes with the others: insert it, then evict.
  absl::StatusOr<int> decode(const BatchItem& item, SeqRef seq, int row0, int head, float beta,
                             bool new_key_competes) {
    const auto evict = [&] {
      return cache_.evict_for_step(seq, layer_, head, at(rows_.phi, row0, head), beta,
                                   item.start_pos);
    };
    const int evicted = new_key_competes ? 0 : evict();
    if (absl::Status s = insert(seq, head, row0, item.start_pos, kInf); !s.ok()) return s;
    return new_key_competes ? evict() : evicted;
  }

  // A prompt chunk: insert its keys with their suffix minimum, then evict at the chunk's minimum.
  // A key already dead by the dips after it within the chunk is never cached (it counts as
  // evicted), which spares the pages and a mirror's writes.
  absl::StatusOr<int> chunk(const BatchItem& item, SeqRef seq, int row0, int head, float beta) {
    const int len = static_cast<int>(item.tokens.size());
    const float thr = cache_.threshold(item.seq, beta);
    float after = kInf;  // min of phi over the rows after t
    float lowest = kInf;
    suffix_.resize(static_cast<size_t>(len));
    for (int t = len - 1; t >= 0; --t) {
      suffix_[static_cast<size_t>(t)] = after;
      after = std::min(after, at(rows_.phi, row0 + t, head));
      lowest = std::min(lowest, at(rows_.phi, row0 + t, head));
    }
    int dropped = 0;
    for (int t = 0; t < len; ++t) {
      const float m = suffix_[static_cast<size_t>(t)];
      if (at(rows_.lvl, row0 + t, head) - m >= thr) {
        ++dropped;
        continue;
      }
      absl::Status s = insert(seq, head, row0 + t, item.start_pos + t, m);
      if (!s.ok()) return s;
    }
    cache_.count_dropped(dropped);
    return cache_.evict_for_chunk(seq, layer_, head, lowest, beta, item.start_pos + len - 1);
  }

  // Asks the cache for the state of the streams after stream s (counted item by item, head by
  // head, in step order), 3 - step times kAhead ahead at step `step` of KvCache::prefetch: a
  // stream's state was fetched from memory load by load, 5-6 us a stream.
  void prefetch_ahead(int heads, int s) const {
    constexpr int kAhead = 4;
    const int streams = static_cast<int>(seqs_.size()) * heads;
    for (int step = 0; step < 3; ++step) {
      const int ahead = s + kAhead * (3 - step);
      if (ahead < streams) {
        cache_.prefetch(seqs_[static_cast<size_t>(ahead / heads)], layer_, ahead % heads, step);
      }
    }
  }

  // The walk's value at the item's last row, where the next step continues it.
  void keep_phi(SeqRef seq, int last_row, int head) {
    cache_.set_last_phi(seq, layer_, head, at(rows_.phi, last_row, head));
  }

  void compact(SeqRef seq, int head) {
    if (!sends()) {
      cache_.compact(seq, layer_, head);
      return;
    }
    const int slots = cache_.shape().page_slots;
    cache_.compact(seq, layer_, head, [&](SlotRef from, SlotRef to) {
      out_.moves.push_back(SlotMove{from.page * slots + from.slot, to.page * slots + to.slot});
    });
  }

  // Item i's streams at `row0`: evicts and inserts head by head, then settles their counters
  // (also when an edit failed). Appends the streams that lost keys to `shrunk`.
  absl::StatusOr<int> item(const BatchItem& item, size_t i, int row0, std::span<const float> beta,
                           std::vector<std::pair<SeqRef, int>>& shrunk) {
    const SeqRef seq = seqs_[i];
    const int len = static_cast<int>(item.tokens.size());
    const int heads = static_cast<int>(beta.size());
    const bool competes = cache_.mass_rule(item.seq).mode == MassRule::Mode::kLast;
    absl::StatusOr<int> evicted = 0;
    for (int h = 0; h < heads; ++h) {
      prefetch_ahead(heads, static_cast<int>(i) * heads + h);
      absl::StatusOr<int> n = len == 1 ? decode(item, seq, row0, h, beta[h], competes)
                                       : chunk(item, seq, row0, h, beta[h]);
      if (!n.ok()) {
        evicted = n.status();
        break;
      }
      *evicted += *n;
      if (*n > 0) shrunk.emplace_back(seq, h);
      keep_phi(seq, row0 + len - 1, h);
    }
    cache_.settle(seq, layer_, 0, heads);
    return evicted;
  }

  // The items' whole update, their rows from `row0`: every item's evictions and inserts, then
  // the compaction of the streams that lost keys (after every insert of these items, so that a
  // page compaction frees is never handed to another of their streams before the writes above).
  absl::StatusOr<int64_t> apply(std::span<const BatchItem> items, std::span<const float> beta,
                                int row0) {
    seqs_.clear();
    for (const BatchItem& item : items) seqs_.push_back(cache_.resolve(item.seq));
    int64_t evicted = 0;
    std::vector<std::pair<SeqRef, int>> shrunk;  // (seq, head) that lost keys
    for (size_t i = 0; i < items.size(); ++i) {
      absl::StatusOr<int> n = item(items[i], i, row0, beta, shrunk);
      if (!n.ok()) return n.status();
      evicted += *n;
      row0 += static_cast<int>(items[i].tokens.size());
    }
    for (const auto& [seq, h] : shrunk) compact(seq, h);
    send();
    return evicted;
  }

 private:
  KvCache& cache_;
  const int layer_;
  const LayerRows& rows_;
  const absl::StatusOr<DevicePool*> device_;
  LayerEdits out_;
  std::vector<float> suffix_;
  std::vector<SeqRef> seqs_;  // the items' sequences, looked up once
};

namespace {

// A run of consecutive items for one thread: its first item and that item's first row.
struct Run {
  size_t first;
  int row0;
};

// Items split into `slices` runs with about as many rows each; a last entry marks the end
// (items.size() and the rows of all).
std::vector<Run> split_items(std::span<const BatchItem> items, int slices) {
  int64_t total = 0;
  for (const BatchItem& item : items) total += static_cast<int64_t>(item.tokens.size());
  std::vector<Run> runs{{0, 0}};
  int row = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    // Item i opens the next run once the rows before it reach that run's share.
    if (int64_t{row} * slices >= total * static_cast<int64_t>(runs.size()) &&
        i > runs.back().first) {
      runs.push_back({i, row});
    }
    row += static_cast<int>(items[i].tokens.size());
  }
  runs.push_back({items.size(), row});
  return runs;
}

}  // namespace

absl::StatusOr<int64_t> apply_layer(KvCache& cache, int layer, std::span<const BatchItem> items,
                                    std::span<const float> beta, const LayerRows& rows,
                                    const Workers* workers) {
  LayerWriter writer(cache, layer, rows);
  if (absl::Status s = writer.device_status(); !s.ok()) return s;
  const int slices = workers == nullptr || writer.sends()
                         ? 1
                         : std::min(workers->threads, static_cast<int>(items.size()));
  if (slices <= 1) return writer.apply(items, beta, 0);
  // Sequences apart, on the workers: a host pool only, whose edits need no order among them.
  const std::vector<Run> runs = split_items(items, slices);
  const int n = static_cast<int>(runs.size()) - 1;
  std::vector<absl::StatusOr<int64_t>> evicted(static_cast<size_t>(n), int64_t{0});
  workers->run(n, [&](int r) {
    const Run& run = runs[r];
    evicted[r] =
        LayerWriter(cache, layer, rows)
            .apply(items.subspan(run.first, runs[r + 1].first - run.first), beta, run.row0);
  });
  int64_t total = 0;
  for (const absl::StatusOr<int64_t>& n : evicted) {
    if (!n.ok()) return n.status();
    total += *n;
  }
  return total;
}

}  // namespace fpa::cache
