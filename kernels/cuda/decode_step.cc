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

absl::Status settle_decode(cache::KvCache& cache, std::span<const cache::BatchItem> items,
                           const BatchLayout& layout, std::span<const std::span<const float>> betas,
                           const DecodeField& field, std::span<const int32_t> retired) {
  for (int l = 0; l < static_cast<int>(betas.size()); ++l) {
    const long heads = static_cast<long>(betas[l].size());
    const size_t block = static_cast<size_t>(l) * layout.rows * heads;
    const cache::LayerRows rows{
        .phi = field.phi + block, .lvl = field.lvl + block, .row_stride = heads, .head_stride = 1};
    absl::StatusOr<int64_t> evicted = cache::apply_layer(cache, l, items, betas[l], rows);
    if (!evicted.ok()) return evicted.status();
    if (*evicted != retired[l]) {
      return absl::InternalError(absl::StrCat("layer ", l, ": the cache evicted ", *evicted,
                                              " keys, the device retired ", retired[l],
                                              " (host and device disagree on the live keys)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace fpa::cuda
