#include "kernels/cuda/step_plan.h"

#include <limits>
#include <string>
#include <unordered_set>

#include "absl/strings/str_cat.h"

namespace fpa::cuda {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

absl::Status check_item(const ForwardItem& item, size_t index, const ModelDims& dims,
                        const cache::KvCache& cache) {
  if (item.tokens.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("forward item ", index, " has no tokens"));
  }
  if (item.start_pos < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("forward item ", index, " has negative start_pos ", item.start_pos));
  }
  for (int32_t t : item.tokens) {
    if (t < 0 || t >= dims.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("forward item ", index, ": token ", t,
                                                     " outside [0, ", dims.vocab_size, ")"));
    }
  }
  if (absl::Status st = check_policy(cache.policy(item.seq)); !st.ok()) {
    return absl::UnimplementedError(absl::StrCat("forward item ", index, ": ", st.message()));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status check_policy(const cache::PolicyConfig& policy) {
  if (policy.policy == cache::Policy::kFpa || policy.policy == cache::Policy::kNone) {
    return absl::OkStatus();
  }
  return absl::UnimplementedError(absl::StrCat(
      "eviction_policy ", std::string(cache::policy_name(policy.policy)),
      ": the cuda backend supports only the fpa and none eviction policies (the heuristic "
      "ones need per-slot state it does not mirror); run it on --backend cpu"));
}

absl::StatusOr<BatchLayout> plan_batch(std::span<const ForwardItem> items, size_t logits_size,
                                       bool all_logits, const ModelDims& dims,
                                       const cache::KvCache& cache) {
  BatchLayout layout;
  std::unordered_set<cache::SeqId> seen;
  int64_t pages = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    const ForwardItem& item = items[i];
    if (!seen.insert(item.seq).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("sequence ", item.seq, " appears twice in one forward batch"));
    }
    if (absl::Status s = check_item(item, i, dims, cache); !s.ok()) return s;
    const int len = static_cast<int>(item.tokens.size());
    layout.item_row0.push_back(layout.rows);
    layout.item_len.push_back(len);
    layout.item_pos0.push_back(item.start_pos);
    for (int t = 0; t < len; ++t) {
      layout.tokens.push_back(item.tokens[t]);
      layout.row_item.push_back(static_cast<int32_t>(i));
      layout.row_pos.push_back(item.start_pos + t);
      if (all_logits || t == len - 1) layout.out_rows.push_back(layout.rows + t);
    }
    layout.rows += len;
    pages += cache.pages_needed(item.seq, len);
  }
  const size_t need = layout.out_rows.size() * static_cast<size_t>(dims.vocab_size);
  if (logits_size < need) {
    return absl::InvalidArgumentError(
        absl::StrCat("logits span holds ", logits_size, " floats, the batch needs ", need));
  }
  if (pages > cache.free_pages()) {
    return absl::ResourceExhaustedError(absl::StrCat("KV cache: the step may need ", pages,
                                                     " pages, ", cache.free_pages(), " are free"));
  }
  return layout;
}

std::vector<float> eviction_thresholds(std::span<const ForwardItem> items,
                                       std::span<const float> beta, const cache::KvCache& cache) {
  std::vector<float> thr;
  thr.reserve(items.size() * beta.size());
  for (const ForwardItem& item : items) {
    const cache::PolicyConfig& policy = cache.policy(item.seq);
    for (float b : beta) {
      const bool evicts = policy.policy == cache::Policy::kFpa && b > 0.0f;
      thr.push_back(evicts ? policy.tau / b : kInf);
    }
  }
  return thr;
}

PageTables snapshot_page_tables(std::span<const ForwardItem> items, int layer, int n_heads,
                                const cache::KvCache& cache) {
  PageTables tables;
  for (const ForwardItem& item : items) {
    for (int h = 0; h < n_heads; ++h) {
      std::span<const int32_t> pages = cache.pages(item.seq, layer, h);
      tables.offset.push_back(static_cast<int32_t>(tables.ids.size()));
      tables.count.push_back(static_cast<int32_t>(pages.size()));
      tables.ids.insert(tables.ids.end(), pages.begin(), pages.end());
      tables.max_count = std::max(tables.max_count, static_cast<int>(pages.size()));
    }
  }
  return tables;
}

namespace {

// Inserts the keys of one stream's chunk that survive it; records new pages and device writes.
absl::Status insert_chunk(const ForwardItem& item, int row0, int layer, int head, int n_heads,
                          float thr, const FieldRows& field, cache::KvCache& cache,
                          LayerUpdate& update) {
  const int page_slots = cache.shape().page_slots;
  const int len = static_cast<int>(item.tokens.size());
  for (int t = 0; t < len; ++t) {
    const size_t at = static_cast<size_t>(row0 + t) * n_heads + head;
    const float lvl = field.lvl[at];
    const float m = field.smin[at];
    if (lvl - m >= thr) continue;  // died within the chunk: the cache never holds it
    const size_t pages_before = cache.pages(item.seq, layer, head).size();
    const int32_t pos = item.start_pos + t;
    absl::StatusOr<cache::SlotRef> slot =
        cache.insert(item.seq, layer, head, pos, lvl, nullptr, nullptr, m);
    if (!slot.ok()) return slot.status();
    if (cache.pages(item.seq, layer, head).size() > pages_before) {
      update.reset_pages.push_back(slot->page);
    }
    update.writes.push_back(
        KeyWrite{slot->page * page_slots + slot->slot, row0 + t, head, pos, lvl, m});
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<LayerUpdate> update_layer(std::span<const ForwardItem> items,
                                         const BatchLayout& layout, int layer,
                                         std::span<const float> beta,
                                         std::span<const float> thresholds, const FieldRows& field,
                                         cache::KvCache& cache) {
  const int n_heads = static_cast<int>(beta.size());
  LayerUpdate update;
  std::vector<std::pair<cache::SeqId, int>> shrunk;  // (seq, head) that lost keys
  for (size_t i = 0; i < items.size(); ++i) {
    const ForwardItem& item = items[i];
    const int row0 = layout.item_row0[i];
    const int len = layout.item_len[i];
    const int32_t last_pos = item.start_pos + len - 1;
    for (int h = 0; h < n_heads; ++h) {
      const size_t last = static_cast<size_t>(row0 + len - 1) * n_heads + h;
      const int evicted =
          len == 1 ? cache.evict_for_step(item.seq, layer, h, field.phi[last], beta[h], last_pos)
                   : cache.evict_for_chunk(item.seq, layer, h, field.cmin[last], beta[h], last_pos);
      update.evicted += evicted;
      if (evicted > 0) shrunk.emplace_back(item.seq, h);
      const float thr = thresholds[i * n_heads + h];
      if (absl::Status s = insert_chunk(item, row0, layer, h, n_heads, thr, field, cache, update);
          !s.ok()) {
        return s;
      }
      cache.set_last_phi(item.seq, layer, h, field.phi[last]);
    }
  }
  // Compaction runs after every insert of the layer, so that the device can apply all page
  // resets, then all key writes, then the moves in order: a page compacted away here is never
  // handed to another stream before the writes above.
  const int page_slots = cache.shape().page_slots;
  for (const auto& [seq, h] : shrunk) {
    cache.compact(seq, layer, h, [&](cache::SlotRef from, cache::SlotRef to) {
      update.moves.push_back(
          SlotMove{from.page * page_slots + from.slot, to.page * page_slots + to.slot});
    });
  }
  return update;
}

std::vector<SyntheticKey> synthetic_walk(int n_tokens, float phi0, float phi_step, int keep_last) {
  std::vector<SyntheticKey> keys;
  const float phi_end = phi0 + phi_step * n_tokens;
  for (int t = std::max(0, n_tokens - keep_last); t < n_tokens; ++t) {
    // The walk is monotone: its minimum after t lies at one end of (t, n_tokens].
    const float m = t + 1 == n_tokens ? kInf : std::min(phi0 + phi_step * (t + 2), phi_end);
    keys.push_back({t, phi0 + phi_step * (t + 1), m});
  }
  return keys;
}

}  // namespace fpa::cuda
