#include "kernels/cuda/decode_step.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace fpa::cuda {

bool decode_only(std::span<const cache::BatchItem> items) {
  return std::all_of(items.begin(), items.end(),
                     [](const cache::BatchItem& item) { return item.tokens.size() == 1; });
}

void append_kernel_inputs(std::span<const cache::BatchItem> items, int layer,
                          std::span<const float> beta, const cache::KvView& cache,
                          KernelInputs& in) {
  const int n_heads = static_cast<int>(beta.size());
  for (const cache::BatchItem& item : items) {
    for (int h = 0; h < n_heads; ++h) in.phi_prev.push_back(cache.last_phi(item.seq, layer, h));
  }
  const std::vector<float> thr = eviction_thresholds(items, beta, cache);
  in.thr.insert(in.thr.end(), thr.begin(), thr.end());
  const PageTables tables = snapshot_page_tables(items, layer, n_heads, cache);
  const auto shift = static_cast<int32_t>(in.tables.ids.size());
  for (int32_t off : tables.offset) in.tables.offset.push_back(off + shift);
  in.tables.count.insert(in.tables.count.end(), tables.count.begin(), tables.count.end());
  in.tables.ids.insert(in.tables.ids.end(), tables.ids.begin(), tables.ids.end());
  in.tables.max_count = std::max(in.tables.max_count, tables.max_count);
  in.max_count.push_back(tables.max_count);
}

KernelInputs kernel_inputs(std::span<const cache::BatchItem> items,
                           std::span<const std::span<const float>> betas,
                           const cache::KvView& cache) {
  KernelInputs in;
  for (int l = 0; l < static_cast<int>(betas.size()); ++l) {
    append_kernel_inputs(items, l, betas[l], cache, in);
  }
  return in;
}

absl::StatusOr<std::vector<cache::LayerChanges>> settle_decode(
    cache::KvCache& cache, std::span<const cache::BatchItem> items, const BatchLayout& layout,
    std::span<const std::span<const float>> betas, const DecodeField& field,
    std::span<const int32_t> retired) {
  std::vector<cache::LayerChanges> out;
  for (int l = 0; l < static_cast<int>(betas.size()); ++l) {
    const long heads = static_cast<long>(betas[l].size());
    const size_t block = static_cast<size_t>(l) * layout.rows * heads;
    const cache::LayerRows rows{
        .phi = field.phi + block, .lvl = field.lvl + block, .row_stride = heads, .head_stride = 1};
    absl::StatusOr<cache::LayerChanges> changes =
        cache::apply_layer(cache, l, items, betas[l], rows);
    if (!changes.ok()) return changes.status();
    if (changes->evicted != retired[l]) {
      return absl::InternalError(absl::StrCat("layer ", l, ": the cache evicted ", changes->evicted,
                                              " keys, the device retired ", retired[l],
                                              " (host and device disagree on the live keys)"));
    }
    out.push_back(*std::move(changes));
  }
  return out;
}

FlatChanges flatten(std::span<const cache::LayerChanges> layers, int rows) {
  FlatChanges flat;
  auto range = [](size_t first, size_t count) {
    return FlatChanges::Range{static_cast<int32_t>(first), static_cast<int32_t>(count)};
  };
  for (size_t l = 0; l < layers.size(); ++l) {
    const cache::LayerChanges& c = layers[l];
    flat.layers.push_back({range(flat.resets.size(), c.reset_pages.size()),
                           range(flat.writes.size(), c.writes.size()),
                           range(flat.moves.size(), c.moves.size())});
    flat.resets.insert(flat.resets.end(), c.reset_pages.begin(), c.reset_pages.end());
    for (cache::KeyWrite w : c.writes) {
      w.row += static_cast<int32_t>(l) * rows;
      flat.writes.push_back(w);
    }
    flat.moves.insert(flat.moves.end(), c.moves.begin(), c.moves.end());
  }
  return flat;
}

}  // namespace fpa::cuda
