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
  void send() const {
    if (sends()) (*device_)->apply(layer_, out_);
  }

  float at(const float* values, int row, int head) const {
    return values[row * rows_.row_stride + head * rows_.head_stride];
  }

  // One key of row `row` at `pos`, running minimum `m`.
  absl::Status insert(SeqId seq, int head, int row, int32_t pos, float m) {
    const size_t pages_before = sends() ? cache_.pages(seq, layer_, head).size() : 0;
    const float lvl = at(rows_.lvl, row, head);
    const long kv = row * rows_.kv_stride + static_cast<long>(head) * cache_.shape().head_dim;
    absl::StatusOr<SlotRef> slot =
        cache_.insert(seq, layer_, head, pos, lvl, rows_.k ? rows_.k + kv : nullptr,
                      rows_.v ? rows_.v + kv : nullptr, m);
    if (!slot.ok()) return slot.status();
    if (sends() && cache_.pages(seq, layer_, head).size() > pages_before) {
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
  absl::StatusOr<int> decode(const BatchItem& item, int row0, int head, float beta,
                             bool new_key_competes) {
    const auto evict = [&] {
      return cache_.evict_for_step(item.seq, layer_, head, at(rows_.phi, row0, head), beta,
                                   item.start_pos);
    };
    const int evicted = new_key_competes ? 0 : evict();
    if (absl::Status s = insert(item.seq, head, row0, item.start_pos, kInf); !s.ok()) return s;
    return new_key_competes ? evict() : evicted;
  }

  // A prompt chunk: insert its keys with their suffix minimum, then evict at the chunk's minimum.
  // A key already dead by the dips after it within the chunk is never cached (it counts as
  // evicted), which spares the pages and a mirror's writes.
  absl::StatusOr<int> chunk(const BatchItem& item, int row0, int head, float beta) {
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
      absl::Status s = insert(item.seq, head, row0 + t, item.start_pos + t, m);
      if (!s.ok()) return s;
    }
    cache_.count_dropped(dropped);
    return cache_.evict_for_chunk(item.seq, layer_, head, lowest, beta, item.start_pos + len - 1);
  }

  // Asks the cache for the state of the streams after stream s (counted item by item, head by
  // head, in step order), 3 - step times kAhead ahead at step `step` of KvCache::prefetch: a
  // stream's state was fetched from memory load by load, 5-6 us a stream.
  void prefetch_ahead(std::span<const BatchItem> items, int heads, int s) const {
    constexpr int kAhead = 4;
    const int streams = static_cast<int>(items.size()) * heads;
    for (int step = 0; step < 3; ++step) {
      const int ahead = s + kAhead * (3 - step);
      if (ahead < streams) {
        cache_.prefetch(items[static_cast<size_t>(ahead / heads)].seq, layer_, ahead % heads, step);
      }
    }
  }

  // The walk's value at the item's last row, where the next step continues it.
  void keep_phi(const BatchItem& item, int last_row, int head) {
    cache_.set_last_phi(item.seq, layer_, head, at(rows_.phi, last_row, head));
  }

  void compact(SeqId seq, int head) {
    if (!sends()) {
      cache_.compact(seq, layer_, head);
      return;
    }
    const int slots = cache_.shape().page_slots;
    cache_.compact(seq, layer_, head, [&](SlotRef from, SlotRef to) {
      out_.moves.push_back(SlotMove{from.page * slots + from.slot, to.page * slots + to.slot});
    });
  }

 private:
  bool sends() const { return device_.ok() && *device_ != nullptr; }

  KvCache& cache_;
  const int layer_;
  const LayerRows& rows_;
  const absl::StatusOr<DevicePool*> device_;
  LayerEdits out_;
  std::vector<float> suffix_;
};

absl::StatusOr<int64_t> apply_layer(KvCache& cache, int layer, std::span<const BatchItem> items,
                                    std::span<const float> beta, const LayerRows& rows) {
  LayerWriter writer(cache, layer, rows);
  if (absl::Status s = writer.device_status(); !s.ok()) return s;
  int64_t evicted = 0;
  std::vector<std::pair<SeqId, int>> shrunk;  // (seq, head) that lost keys
  const int heads = static_cast<int>(beta.size());
  int row0 = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    const BatchItem& item = items[i];
    const int len = static_cast<int>(item.tokens.size());
    const bool competes = cache.mass_rule(item.seq).mode == MassRule::Mode::kLast;
    for (int h = 0; h < heads; ++h) {
      writer.prefetch_ahead(items, heads, static_cast<int>(i) * heads + h);
      absl::StatusOr<int> n = len == 1 ? writer.decode(item, row0, h, beta[h], competes)
                                       : writer.chunk(item, row0, h, beta[h]);
      if (!n.ok()) return n.status();
      evicted += *n;
      if (*n > 0) shrunk.emplace_back(item.seq, h);
      writer.keep_phi(item, row0 + len - 1, h);
    }
    row0 += len;
  }
  for (const auto& [seq, h] : shrunk) writer.compact(seq, h);
  writer.send();
  return evicted;
}

}  // namespace fpa::cache
