#include "kernels/cuda/step_plan.h"

#include <limits>
#include <string>
#include <unordered_set>

#include "absl/strings/str_cat.h"
#include "cache/eviction.h"

namespace fpa::cuda {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

absl::Status check_item(const cache::BatchItem& item, size_t index, const ModelDims& dims) {
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
  return absl::OkStatus();
}

}  // namespace

absl::Status check_policy(const cache::PolicyConfig& policy) {
  if (cache::make_rule(policy)->kernels_exclude_evicted()) return absl::OkStatus();
  return absl::UnimplementedError(absl::StrCat(
      "eviction_policy ", std::string(cache::policy_name(policy.policy)),
      ": the cuda backend supports only the fpa and none eviction policies (the heuristic "
      "ones free slots its kernels cannot tell apart); run it on --backend cpu"));
}

absl::StatusOr<BatchLayout> plan_batch(std::span<const cache::BatchItem> items, size_t logits_size,
                                       bool all_logits, const ModelDims& dims) {
  BatchLayout layout;
  std::unordered_set<cache::SeqId> seen;
  for (size_t i = 0; i < items.size(); ++i) {
    const cache::BatchItem& item = items[i];
    if (!seen.insert(item.seq).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("sequence ", item.seq, " appears twice in one forward batch"));
    }
    if (absl::Status s = check_item(item, i, dims); !s.ok()) return s;
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
  }
  const size_t need = layout.out_rows.size() * static_cast<size_t>(dims.vocab_size);
  if (logits_size < need) {
    return absl::InvalidArgumentError(
        absl::StrCat("logits span holds ", logits_size, " floats, the batch needs ", need));
  }
  return layout;
}

std::vector<float> eviction_thresholds(std::span<const cache::BatchItem> items,
                                       std::span<const float> beta, const cache::KvView& cache) {
  std::vector<float> thr;
  thr.reserve(items.size() * beta.size());
  for (const cache::BatchItem& item : items) {
    for (float b : beta) thr.push_back(cache.threshold(item.seq, b));
  }
  return thr;
}

PageTables snapshot_page_tables(std::span<const cache::BatchItem> items, int layer, int n_heads,
                                const cache::KvView& cache) {
  PageTables tables;
  for (const cache::BatchItem& item : items) {
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

std::vector<int32_t> chunk_tiles(std::span<const int32_t> item_row0,
                                 std::span<const int32_t> item_len) {
  std::vector<int32_t> tiles;
  for (size_t i = 0; i < item_row0.size(); ++i) {
    if (item_len[i] <= 1) continue;
    for (int32_t r = 0; r < item_len[i]; r += kChunkTile) tiles.push_back(item_row0[i] + r);
  }
  return tiles;
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
