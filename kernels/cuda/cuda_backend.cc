// The CUDA Backend: per layer, cuBLAS projections, the field walk, paged attention and the MLP.
// A decode step runs every layer on the device as one graph and the host cache settles all
// layers after it (decode_step.h); a step with prompt chunks settles each layer before the next
// (the chunk's key writes read that layer's rows). Either way the cache sends its slot edits to the
// backend as its cache::DevicePool, which replays them on the device page pool.
#include "kernels/cuda/cuda_backend.h"

#include <algorithm>
#include <cmath>
#include <iostream>
#include <limits>
#include <mutex>
#include <optional>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "cache/device_pool.h"
#include "cache/layer_update.h"
#include "cache/stream_access.h"
#include "kernels/cuda/decode_step.h"
#include "kernels/cuda/device_kernels.h"
#include "kernels/cuda/device_memory.h"
#include "kernels/cuda/device_weights.h"
#include "kernels/cuda/flat_edits.h"
#include "kernels/cuda/fox_pro_ops.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/launch_check.h"
#include "kernels/cuda/projection_layout.h"
#include "kernels/cuda/shift_rows.h"
#include "kernels/cuda/step_graph.h"
#include "kernels/cuda/step_plan.h"
#include "model/status_macros.h"

namespace fpa {
namespace {

using cuda::cuda_status;
using cuda::DeviceBuffer;
using cuda::upload;

// Page-locked host memory, so that copies back run asynchronously on the stream.
class PinnedBuffer {
 public:
  ~PinnedBuffer() {
    if (ptr_) cudaFreeHost(ptr_);
  }
  absl::Status reserve(size_t bytes) {
    if (bytes <= size_) return absl::OkStatus();
    if (ptr_) cudaFreeHost(ptr_);
    ptr_ = nullptr;
    size_ = 0;
    FPA_RETURN_IF_ERROR(cuda_status(cudaMallocHost(&ptr_, bytes), "cudaMallocHost"));
    size_ = bytes;
    return absl::OkStatus();
  }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }

 private:
  void* ptr_ = nullptr;
  size_t size_ = 0;
};

// Grow-only device scratch of one forward call.
struct Scratch {
  DeviceBuffer tokens, row_item, row_pos, item_row0, item_len, item_pos0, out_rows;
  DeviceBuffer h, x, qkv, fl, attn, gate_up, act;
  DeviceBuffer phi, lvl, cmin, smin, phi_prev, thr;
  DeviceBuffer page_ids, page_off, page_cnt, partial, retired, tc_tiles;
  DeviceBuffer resets, writes, moves, copies;
  DeviceBuffer x_out, logits;
  PinnedBuffer field_host;  // phi | lvl (floats), then the retired counts (int32)
};

// Where one layer's kernels read and write: the scratch buffers themselves (a step settled layer
// by layer) or the layer's block of them (a decode step, which keeps every layer's rows).
struct LayerIo {
  float* qkv = nullptr;
  float* phi = nullptr;
  float* lvl = nullptr;
  float* cmin = nullptr;
  float* smin = nullptr;
  const float* phi_prev = nullptr;
  const float* thr = nullptr;
  const int32_t* page_ids = nullptr;
  const int32_t* page_off = nullptr;
  const int32_t* page_cnt = nullptr;
  int max_count = 0;
  int32_t* retired = nullptr;
  const int32_t* tc_tiles = nullptr;  // the prompt chunks' row tiles (step_plan.h chunk_tiles)
  int n_tc_tiles = 0;
};

// Also the cache's device (cache::DevicePool): every slot edit the cache makes reaches the device
// pool through it.
class CudaBackendImpl final : public CudaBackend, public cache::DevicePool {
 public:
  CudaBackendImpl(const Model& model, cache::KvCache& cache, const CudaOptions& options)
      : model_(model),
        cache_(cache),
        options_(options),
        proj_(cuda::projection_layout(model.config())),
        shift_(model.config().n_layers, proj_.attn_width) {
    for (const auto& layer : model.layers()) betas_.emplace_back(layer.beta);
  }
  ~CudaBackendImpl() override {
    cache_.attach_device(nullptr);
    if (field_ready_) cudaEventDestroy(field_ready_);
    if (stream_) cudaStreamDestroy(stream_);
  }

  absl::Status init();
  std::string_view name() const override { return "cuda"; }
  absl::Status check_policy(const cache::PolicyConfig& policy) const override {
    return cuda::check_policy(policy);
  }
  absl::Status forward(std::span<const cache::BatchItem> items, std::span<float> logits,
                       ForwardTrace* trace) override;
  absl::StatusOr<std::vector<int32_t>> live_positions(cache::SeqId seq, int layer,
                                                      int head) override;
  absl::Status append_synthetic_keys(cache::SeqId seq, int32_t start_pos, int n_tokens,
                                     float phi_step, int keep_last) override;
  void apply(int layer, const cache::LayerEdits& edits) override;
  absl::Status copy_slots(std::span<const int32_t> reset_pages,
                          std::span<const cache::SlotCopy> copies) override;

 private:
  int attn_width() const { return proj_.attn_width; }
  int qkv_stride() const { return proj_.qkv_stride; }
  bool shifts() const { return cfg().k_shift || cfg().v_shift; }
  const ModelConfig& cfg() const { return model_.config(); }
  absl::Status reserve_rows(const cuda::BatchLayout& layout, int items, int layer_blocks);
  absl::Status upload_layout(const cuda::BatchLayout& layout);
  absl::Status forward_rows(std::span<const cache::BatchItem> items,
                            const cuda::BatchLayout& layout, std::span<float> logits,
                            ForwardTrace* trace);
  absl::Status forward_layered(std::span<const cache::BatchItem> items,
                               const cuda::BatchLayout& layout, std::span<float> logits,
                               ForwardTrace* trace);
  absl::Status settle_layer(int layer, std::span<const cache::BatchItem> items,
                            const cuda::BatchLayout& layout);
  absl::Status forward_decode(std::span<const cache::BatchItem> items,
                              const cuda::BatchLayout& layout, std::span<float> logits);
  absl::Status upload_kernel_inputs(const cuda::KernelInputs& in);
  absl::Status decode_launches(const cuda::KernelInputs& in, const cuda::BatchLayout& layout,
                               int items);
  absl::Status settle_decode(std::span<const cache::BatchItem> items,
                             const cuda::BatchLayout& layout);
  absl::Status attention_launches(int layer, const LayerIo& io, const cuda::BatchLayout& layout,
                                  int items);
  absl::Status shift_and_norm_qk(int layer, const LayerIo& io, int rows, int items);
  absl::Status field_walk(int layer, const LayerIo& io, int items);
  absl::Status attend(int layer, const LayerIo& io, const cuda::BatchLayout& layout, int items);
  absl::Status reserve_partial(int rows, int max_count);
  int splits(int rows, int max_count) const;
  absl::Status norm_and_gate_output(int layer, const LayerIo& io, int rows);
  absl::Status replay_edits(std::optional<uint32_t> synthetic_seed = std::nullopt);
  absl::Status mlp_block(int layer, int rows);
  absl::Status logits_launches(const cuda::BatchLayout& layout);
  absl::Status download_logits(const cuda::BatchLayout& layout, std::span<float> logits);

  const Model& model_;
  cache::KvCache& cache_;
  CudaOptions options_;
  cuda::ProjectionLayout proj_;  // where FoX Pro's extra projections sit in the fused rows
  cuda::ShiftRows shift_;        // k_shift / v_shift models: each sequence's last k and v rows
  std::vector<std::span<const float>> betas_;  // per layer: the heads' penalty scale
  cudaStream_t stream_ = nullptr;
  cudaEvent_t field_ready_ = nullptr;
  cuda::Gemm gemm_;
  cuda::DeviceWeights weights_;
  cuda::StepGraph graph_;
  bool graphs_ = options_.graphs;  // false for good once a capture failed
  DeviceBuffer pool_memory_;
  cuda::PoolView pool_;
  std::mutex mu_;
  Scratch s_;
  cuda::FlatEdits edits_;  // what the cache sent (apply) since the last replay
  // Where layer l's rows sit among the qkv rows the step keeps: l * edit_layer_rows_ (a decode
  // step keeps every layer's rows; a step settled layer by layer reuses one block: 0).
  int32_t edit_layer_rows_ = 0;
};

absl::Status CudaBackendImpl::init() {
  FPA_RETURN_IF_ERROR(cuda_status(cudaStreamCreate(&stream_), "cudaStreamCreate"));
  FPA_RETURN_IF_ERROR(cuda_status(cudaEventCreateWithFlags(&field_ready_, cudaEventDisableTiming),
                                  "cudaEventCreate"));
  FPA_RETURN_IF_ERROR(gemm_.init(stream_));
  FPA_RETURN_IF_ERROR(weights_.upload(model_, options_.half_precision, stream_));

  // The whole page pool in one allocation: k | v | lvl | m | pos, indexed by slot.
  const cache::CacheShape& shape = cache_.shape();
  const size_t slots = static_cast<size_t>(cache_.stats().pages_total) * shape.page_slots;
  const size_t elem = static_cast<size_t>(shape.kv_bytes);
  const size_t kv_bytes = (slots * shape.head_dim * elem + 255) / 256 * 256;  // keeps lvl aligned
  FPA_RETURN_IF_ERROR(pool_memory_.reserve(2 * kv_bytes + 3 * slots * 4));
  char* base = pool_memory_.as<char>();
  pool_.k = base;
  pool_.v = base + kv_bytes;
  pool_.lvl = reinterpret_cast<float*>(base + 2 * kv_bytes);
  pool_.m = pool_.lvl + slots;
  pool_.pos = reinterpret_cast<int32_t*>(pool_.m + slots);
  pool_.page_slots = shape.page_slots;
  pool_.head_dim = shape.head_dim;
  pool_.type = shape.kv_bytes == 2 ? cuda::KvType::kBf16 : cuda::KvType::kF32;
  // Every slot starts free (all bytes 0xff: pos -1).
  FPA_RETURN_IF_ERROR(
      cuda_status(cudaMemsetAsync(pool_.pos, 0xff, slots * 4, stream_), "pool init"));
  FPA_RETURN_IF_ERROR(cuda_status(cudaStreamSynchronize(stream_), "pool init"));
  cache_.attach_device(this);
  return absl::OkStatus();
}

// Called by the cache inside a step (apply_layer, under forward's lock): only queued here; the
// step replays the queue (replay_edits) while the layer's rows are still in place.
void CudaBackendImpl::apply(int layer, const cache::LayerEdits& edits) {
  edits_.append(edits, layer * edit_layer_rows_);
}

// On the backend's stream, so the next step reads the copies; waited for, since a fork is rare
// and the scratch it uploads through is the steps' own.
absl::Status CudaBackendImpl::copy_slots(std::span<const int32_t> reset_pages,
                                         std::span<const cache::SlotCopy> copies) {
  std::lock_guard lock(mu_);
  FPA_RETURN_IF_ERROR(upload(s_.resets, reset_pages.data(), reset_pages.size(), stream_));
  FPA_RETURN_IF_ERROR(upload(s_.copies, copies.data(), copies.size(), stream_));
  FPA_RETURN_IF_ERROR(cuda::launch_slot_copies(
      pool_, s_.resets.as<int32_t>(), static_cast<int>(reset_pages.size()),
      s_.copies.as<cuda::SlotCopy>(), static_cast<int>(copies.size()), stream_));
  return cuda_status(cudaStreamSynchronize(stream_), "fork copies");
}

// Scratch for the step's rows; `layer_blocks` copies of the per-layer rows (qkv and the field),
// one per layer for a decode step.
absl::Status CudaBackendImpl::reserve_rows(const cuda::BatchLayout& layout, int items,
                                           int layer_blocks) {
  const size_t rows = layout.rows;
  const size_t d = cfg().d_model;
  const size_t heads = cfg().n_heads;
  const size_t blocks = layer_blocks;
  FPA_RETURN_IF_ERROR(s_.h.reserve(rows * d * 4));
  FPA_RETURN_IF_ERROR(s_.x.reserve(rows * d * 4));
  FPA_RETURN_IF_ERROR(s_.qkv.reserve(blocks * rows * qkv_stride() * 4));
  FPA_RETURN_IF_ERROR(s_.fl.reserve(rows * proj_.field_stride * 4));
  FPA_RETURN_IF_ERROR(s_.attn.reserve(rows * attn_width() * 4));
  FPA_RETURN_IF_ERROR(s_.gate_up.reserve(rows * 2 * cfg().d_ff * 4));
  FPA_RETURN_IF_ERROR(s_.act.reserve(rows * cfg().d_ff * 4));
  for (DeviceBuffer* b : {&s_.phi, &s_.lvl, &s_.cmin, &s_.smin}) {
    FPA_RETURN_IF_ERROR(b->reserve(blocks * rows * heads * 4));
  }
  FPA_RETURN_IF_ERROR(s_.phi_prev.reserve(blocks * items * heads * 4));
  FPA_RETURN_IF_ERROR(s_.retired.reserve(blocks * 4));
  FPA_RETURN_IF_ERROR(s_.field_host.reserve(blocks * (2 * rows * heads + 1) * 4));
  FPA_RETURN_IF_ERROR(
      gemm_.reserve_input(rows * std::max({d, size_t(cfg().d_ff), size_t(attn_width())})));
  const size_t out_rows = layout.out_rows.size();
  FPA_RETURN_IF_ERROR(s_.x_out.reserve(out_rows * d * 4));
  return s_.logits.reserve(out_rows * cfg().vocab_size * 4);
}

absl::Status CudaBackendImpl::upload_layout(const cuda::BatchLayout& layout) {
  FPA_RETURN_IF_ERROR(upload(s_.tokens, layout.tokens.data(), layout.tokens.size(), stream_));
  FPA_RETURN_IF_ERROR(upload(s_.row_item, layout.row_item.data(), layout.row_item.size(), stream_));
  FPA_RETURN_IF_ERROR(upload(s_.row_pos, layout.row_pos.data(), layout.row_pos.size(), stream_));
  FPA_RETURN_IF_ERROR(
      upload(s_.item_row0, layout.item_row0.data(), layout.item_row0.size(), stream_));
  FPA_RETURN_IF_ERROR(upload(s_.item_len, layout.item_len.data(), layout.item_len.size(), stream_));
  FPA_RETURN_IF_ERROR(
      upload(s_.item_pos0, layout.item_pos0.data(), layout.item_pos0.size(), stream_));
  return upload(s_.out_rows, layout.out_rows.data(), layout.out_rows.size(), stream_);
}

absl::Status CudaBackendImpl::forward(std::span<const cache::BatchItem> items,
                                      std::span<float> logits, ForwardTrace* trace) {
  std::lock_guard lock(mu_);  // one forward at a time: the scratch buffers are shared
  const bool all_logits = trace && trace->all_logits;
  const cuda::ModelDims dims{cfg().vocab_size, cfg().n_layers, cfg().n_heads, cfg().head_dim};
  absl::StatusOr<cuda::BatchLayout> layout =
      cuda::plan_batch(items, logits.size(), all_logits, dims);
  if (!layout.ok()) return layout.status();
  if (layout->rows == 0) return absl::OkStatus();
  edits_.clear();  // what a failed step queued was never replayed, nor is it now
  if (!shifts()) return forward_rows(items, *layout, logits, trace);
  FPA_RETURN_IF_ERROR(shift_.begin(items, cache_, stream_));
  FPA_RETURN_IF_ERROR(forward_rows(items, *layout, logits, trace));
  shift_.end(items);
  return absl::OkStatus();
}

absl::Status CudaBackendImpl::forward_rows(std::span<const cache::BatchItem> items,
                                           const cuda::BatchLayout& layout, std::span<float> logits,
                                           ForwardTrace* trace) {
  if (options_.settle_after_step && trace == nullptr && cuda::decode_only(items)) {
    return forward_decode(items, layout, logits);
  }
  return forward_layered(items, layout, logits, trace);
}

// Each layer's cache update is settled (and mirrored) before the next layer runs.
absl::Status CudaBackendImpl::forward_layered(std::span<const cache::BatchItem> items,
                                              const cuda::BatchLayout& layout,
                                              std::span<float> logits, ForwardTrace* trace) {
  const int n_items = static_cast<int>(items.size());
  edit_layer_rows_ = 0;
  FPA_RETURN_IF_ERROR(reserve_rows(layout, n_items, 1));
  FPA_RETURN_IF_ERROR(upload_layout(layout));
  FPA_RETURN_IF_ERROR(cuda::launch_embed(weights_.embed(), s_.tokens.as<int32_t>(), layout.rows,
                                         cfg().d_model, s_.h.as<float>(), stream_));
  if (trace && trace->layer_outputs) trace->layer_outputs->assign(cfg().n_layers, {});
  const std::vector<int32_t> tiles = cuda::chunk_tiles(layout.item_row0, layout.item_len);
  FPA_RETURN_IF_ERROR(upload(s_.tc_tiles, tiles.data(), tiles.size(), stream_));
  const bool tc = options_.tensor_core_prefill;
  for (int l = 0; l < cfg().n_layers; ++l) {
    cuda::KernelInputs in;
    cuda::append_kernel_inputs(items, l, betas_[l], cache_, in);
    FPA_RETURN_IF_ERROR(upload_kernel_inputs(in));
    const LayerIo io{s_.qkv.as<float>(),
                     s_.phi.as<float>(),
                     s_.lvl.as<float>(),
                     s_.cmin.as<float>(),
                     s_.smin.as<float>(),
                     s_.phi_prev.as<float>(),
                     s_.thr.as<float>(),
                     s_.page_ids.as<int32_t>(),
                     s_.page_off.as<int32_t>(),
                     s_.page_cnt.as<int32_t>(),
                     in.max_count[0],
                     nullptr,
                     tc ? s_.tc_tiles.as<int32_t>() : nullptr,
                     tc ? static_cast<int>(tiles.size()) : 0};
    FPA_RETURN_IF_ERROR(reserve_partial(layout.rows, io.max_count));
    FPA_RETURN_IF_ERROR(attention_launches(l, io, layout, n_items));
    // phi and lvl come back while the output projection and the MLP run.
    const size_t n = static_cast<size_t>(layout.rows) * cfg().n_heads;
    float* host = s_.field_host.as<float>();
    for (int i = 0; i < 2; ++i) {
      FPA_RETURN_IF_ERROR(cuda_status(cudaMemcpyAsync(host + i * n, i ? io.lvl : io.phi, n * 4,
                                                      cudaMemcpyDeviceToHost, stream_),
                                      "field copy"));
    }
    FPA_RETURN_IF_ERROR(cuda_status(cudaEventRecord(field_ready_, stream_), "field event"));
    FPA_RETURN_IF_ERROR(mlp_block(l, layout.rows));
    if (trace && trace->layer_outputs) {
      std::vector<float>& out = (*trace->layer_outputs)[l];
      out.resize(static_cast<size_t>(layout.rows) * cfg().d_model);
      FPA_RETURN_IF_ERROR(cuda_status(cudaMemcpyAsync(out.data(), s_.h.as<float>(), out.size() * 4,
                                                      cudaMemcpyDeviceToHost, stream_),
                                      "layer output"));
    }
    FPA_RETURN_IF_ERROR(settle_layer(l, items, layout));
  }
  FPA_RETURN_IF_ERROR(logits_launches(layout));
  return download_logits(layout, logits);
}

// The host bookkeeping of one layer, once its field values are back; its edits are replayed
// before the next layer overwrites the qkv rows they read.
absl::Status CudaBackendImpl::settle_layer(int layer, std::span<const cache::BatchItem> items,
                                           const cuda::BatchLayout& layout) {
  FPA_RETURN_IF_ERROR(cuda_status(cudaEventSynchronize(field_ready_), "field wait"));
  const size_t n = static_cast<size_t>(layout.rows) * cfg().n_heads;
  const float* host = s_.field_host.as<float>();
  const cache::LayerRows rows{
      .phi = host, .lvl = host + n, .row_stride = cfg().n_heads, .head_stride = 1};
  absl::StatusOr<int64_t> evicted = cache::apply_layer(cache_, layer, items, betas_[layer], rows);
  if (!evicted.ok()) return evicted.status();
  return replay_edits();
}

// Every layer without the host: inputs gathered before, the launches captured as one graph, the
// cache settled after (decode_step.h).
absl::Status CudaBackendImpl::forward_decode(std::span<const cache::BatchItem> items,
                                             const cuda::BatchLayout& layout,
                                             std::span<float> logits) {
  const int n_items = static_cast<int>(items.size());
  const int layers = cfg().n_layers;
  edit_layer_rows_ = layout.rows;
  FPA_RETURN_IF_ERROR(reserve_rows(layout, n_items, layers));
  FPA_RETURN_IF_ERROR(upload_layout(layout));
  const cuda::KernelInputs in = cuda::kernel_inputs(items, betas_, cache_);
  FPA_RETURN_IF_ERROR(upload_kernel_inputs(in));
  // Splits grow with the page lists, so the longest list of any layer sizes the scratch for all.
  FPA_RETURN_IF_ERROR(reserve_partial(layout.rows, in.tables.max_count));
  auto launches = [&] { return decode_launches(in, layout, n_items); };
  // FPA_CUDA_SYNC waits after every launch, which a capture cannot hold. A capture that fails
  // (a driver or library that cannot capture what the step enqueues) ran nothing: the step runs
  // launch by launch instead, and so do the later ones.
  const bool capture = graphs_ && !cuda::sync_launches();
  const absl::Status graph =
      capture ? graph_.run(stream_, launches) : absl::UnavailableError("not captured");
  if (capture && !graph.ok()) {
    std::cerr << "fpa-serve: CUDA graph capture failed (" << graph.message()
              << "); decode steps run launch by launch\n";
    graphs_ = false;
  }
  if (!graph.ok()) FPA_RETURN_IF_ERROR(launches());
  // The field of every layer and the retired counts come back with the logits.
  const size_t n = static_cast<size_t>(layers) * layout.rows * cfg().n_heads;
  float* host = s_.field_host.as<float>();
  FPA_RETURN_IF_ERROR(cuda_status(
      cudaMemcpyAsync(host, s_.phi.as<float>(), n * 4, cudaMemcpyDeviceToHost, stream_), "phi"));
  FPA_RETURN_IF_ERROR(cuda_status(
      cudaMemcpyAsync(host + n, s_.lvl.as<float>(), n * 4, cudaMemcpyDeviceToHost, stream_),
      "lvl"));
  FPA_RETURN_IF_ERROR(cuda_status(cudaMemcpyAsync(host + 2 * n, s_.retired.as<int32_t>(),
                                                  layers * 4, cudaMemcpyDeviceToHost, stream_),
                                  "retired"));
  FPA_RETURN_IF_ERROR(download_logits(layout, logits));
  return settle_decode(items, layout);
}

absl::Status CudaBackendImpl::upload_kernel_inputs(const cuda::KernelInputs& in) {
  FPA_RETURN_IF_ERROR(upload(s_.phi_prev, in.phi_prev.data(), in.phi_prev.size(), stream_));
  FPA_RETURN_IF_ERROR(upload(s_.thr, in.thr.data(), in.thr.size(), stream_));
  FPA_RETURN_IF_ERROR(upload(s_.page_ids, in.tables.ids.data(), in.tables.ids.size(), stream_));
  FPA_RETURN_IF_ERROR(
      upload(s_.page_off, in.tables.offset.data(), in.tables.offset.size(), stream_));
  return upload(s_.page_cnt, in.tables.count.data(), in.tables.count.size(), stream_);
}

absl::Status CudaBackendImpl::decode_launches(const cuda::KernelInputs& in,
                                              const cuda::BatchLayout& layout, int items) {
  const int layers = cfg().n_layers;
  const size_t rows = layout.rows;
  const size_t heads = cfg().n_heads;
  FPA_RETURN_IF_ERROR(cuda_status(cudaMemsetAsync(s_.retired.as<int32_t>(), 0, layers * 4, stream_),
                                  "retired reset"));
  FPA_RETURN_IF_ERROR(cuda::launch_embed(weights_.embed(), s_.tokens.as<int32_t>(), layout.rows,
                                         cfg().d_model, s_.h.as<float>(), stream_));
  for (int l = 0; l < layers; ++l) {
    const size_t field = l * rows * heads;
    const size_t streams = l * items * heads;
    const LayerIo io{s_.qkv.as<float>() + l * rows * qkv_stride(),
                     s_.phi.as<float>() + field,
                     s_.lvl.as<float>() + field,
                     s_.cmin.as<float>() + field,
                     s_.smin.as<float>() + field,
                     s_.phi_prev.as<float>() + streams,
                     s_.thr.as<float>() + streams,
                     s_.page_ids.as<int32_t>(),
                     s_.page_off.as<int32_t>() + streams,
                     s_.page_cnt.as<int32_t>() + streams,
                     in.max_count[l],
                     s_.retired.as<int32_t>() + l};
    FPA_RETURN_IF_ERROR(attention_launches(l, io, layout, items));
    FPA_RETURN_IF_ERROR(mlp_block(l, layout.rows));
  }
  return logits_launches(layout);
}

// The cache settles every layer, checked against what the device retired, sending each layer's
// page edits as it goes; the device replays them all after (one upload for the step).
absl::Status CudaBackendImpl::settle_decode(std::span<const cache::BatchItem> items,
                                            const cuda::BatchLayout& layout) {
  const int layers = cfg().n_layers;
  const size_t n = static_cast<size_t>(layers) * layout.rows * cfg().n_heads;
  const float* host = s_.field_host.as<float>();
  const auto* retired = reinterpret_cast<const int32_t*>(host + 2 * n);
  FPA_RETURN_IF_ERROR(cuda::settle_decode(cache_, items, layout, betas_, {host, host + n},
                                          {retired, size_t(layers)}));
  return replay_edits();
}

// The queued edits, each kind uploaded once, replayed layer by layer in the order they came (a
// page one layer's update frees may be the next one's), queued on the stream before the next
// launch reads the pool. Synthetic keys (benchmarks) take hashed k and v instead of rows.
absl::Status CudaBackendImpl::replay_edits(std::optional<uint32_t> synthetic_seed) {
  absl::Cleanup clear = [&] { edits_.clear(); };
  FPA_RETURN_IF_ERROR(upload(s_.resets, edits_.resets.data(), edits_.resets.size(), stream_));
  FPA_RETURN_IF_ERROR(upload(s_.writes, edits_.writes.data(), edits_.writes.size(), stream_));
  FPA_RETURN_IF_ERROR(upload(s_.moves, edits_.moves.data(), edits_.moves.size(), stream_));
  for (const cuda::FlatEdits::Layer& l : edits_.layers) {
    const auto* writes = s_.writes.as<cuda::KeyWrite>() + l.writes.first;
    FPA_RETURN_IF_ERROR(cuda::launch_pool_update(
        pool_, s_.resets.as<int32_t>() + l.resets.first, l.resets.count, writes,
        synthetic_seed ? 0 : l.writes.count, s_.moves.as<cuda::SlotMove>() + l.moves.first,
        l.moves.count, s_.qkv.as<float>(), qkv_stride(), cfg().n_heads, stream_));
    if (synthetic_seed) {
      FPA_RETURN_IF_ERROR(
          cuda::launch_synthetic_writes(pool_, writes, l.writes.count, *synthetic_seed, stream_));
    }
  }
  return absl::OkStatus();
}

absl::Status CudaBackendImpl::attention_launches(int layer, const LayerIo& io,
                                                 const cuda::BatchLayout& layout, int items) {
  const cuda::DeviceLayer& w = weights_.layers()[layer];
  const int rows = layout.rows;
  FPA_RETURN_IF_ERROR(cuda::launch_rmsnorm(s_.h.as<float>(), nullptr, w.attn_norm, rows,
                                           cfg().d_model, cfg().norm_eps, s_.x.as<float>(),
                                           stream_));
  FPA_RETURN_IF_ERROR(gemm_.linear(w.qkv, s_.x.as<float>(), rows, io.qkv));
  if (w.field.data) {
    FPA_RETURN_IF_ERROR(gemm_.linear(w.field, s_.x.as<float>(), rows, s_.fl.as<float>()));
  }
  FPA_RETURN_IF_ERROR(shift_and_norm_qk(layer, io, rows, items));
  if (cfg().rope_theta > 0.0f) {  // softmax models only, by the format
    FPA_RETURN_IF_ERROR(cuda::launch_rope(io.qkv, qkv_stride(), rows, cfg().n_heads, cfg().head_dim,
                                          s_.row_pos.as<int32_t>(), cfg().rope_theta, stream_));
  }
  FPA_RETURN_IF_ERROR(field_walk(layer, io, items));
  FPA_RETURN_IF_ERROR(attend(layer, io, layout, items));
  FPA_RETURN_IF_ERROR(norm_and_gate_output(layer, io, rows));
  return gemm_.linear(w.wo, s_.attn.as<float>(), rows, s_.h.as<float>(), /*accumulate=*/true);
}

// FoX Pro's key / value shift, then its QK-norm, in place on the layer's k, v and q rows (the
// CPU backend's order); the pool's key writes later read the rows as they leave here.
absl::Status CudaBackendImpl::shift_and_norm_qk(int layer, const LayerIo& io, int rows, int items) {
  const cuda::DeviceLayer& w = weights_.layers()[layer];
  if (shifts()) {
    cuda::ShiftArgs a;
    a.qkv = io.qkv;
    a.qkv_stride = qkv_stride();
    a.gates = s_.fl.as<float>();
    a.gate_stride = proj_.field_stride;
    a.k_gate_col = proj_.k_shift_col;
    a.v_gate_col = proj_.v_shift_col;
    a.item_row0 = s_.item_row0.as<int32_t>();
    a.item_len = s_.item_len.as<int32_t>();
    a.item_slot = shift_.item_slot();
    a.state = shift_.rows();
    a.layer = layer;
    a.n_layers = cfg().n_layers;
    a.items = items;
    a.n_heads = cfg().n_heads;
    a.head_dim = cfg().head_dim;
    FPA_RETURN_IF_ERROR(cuda::launch_shift(a, stream_));
  }
  if (!cfg().qk_norm) return absl::OkStatus();
  cuda::HeadNormArgs n;
  n.x = io.qkv;
  n.x_stride = qkv_stride();
  n.rows = rows;
  n.n_heads = cfg().n_heads;
  n.head_dim = cfg().head_dim;
  n.weight = w.q_norm;
  n.weight_head_stride = cfg().qk_norm_shared ? 0 : cfg().head_dim;
  n.eps = cuda::kQkNormEps;
  FPA_RETURN_IF_ERROR(cuda::launch_head_norm(n, stream_));
  n.x = io.qkv + attn_width();
  n.weight = w.k_norm;
  return cuda::launch_head_norm(n, stream_);
}

// FoX Pro's output stage on the attention output, before wo: each head RMS-normed (output_norm),
// then times act(ogate x) (output_gate), ogate x being the end of the layer's qkv rows.
absl::Status CudaBackendImpl::norm_and_gate_output(int layer, const LayerIo& io, int rows) {
  if (!cfg().output_norm && !cfg().output_gate) return absl::OkStatus();
  cuda::HeadNormArgs n;
  n.x = s_.attn.as<float>();
  n.x_stride = attn_width();
  n.rows = rows;
  n.n_heads = cfg().n_heads;
  n.head_dim = cfg().head_dim;
  n.weight = weights_.layers()[layer].out_norm;
  n.weight_head_stride = cfg().head_dim;
  n.eps = cfg().norm_eps;
  if (proj_.ogate_col >= 0) {
    n.gate = io.qkv + proj_.ogate_col;
    n.gate_stride = qkv_stride();
    n.gate_silu = cfg().output_gate_silu;
  }
  return cuda::launch_head_norm(n, stream_);
}

// phi, lvl and the chunk minima of the layer's rows (the field's projection is already in fl).
absl::Status CudaBackendImpl::field_walk(int layer, const LayerIo& io, int items) {
  const cuda::DeviceLayer& w = weights_.layers()[layer];
  cuda::FieldArgs f;
  if (proj_.field) {
    f.fl = s_.fl.as<float>();
    f.fl_stride = proj_.field_stride;
  }
  f.field_b = w.field_b;
  f.level_b = w.level_b;
  f.fox = cfg().attention == AttentionKind::kFox;
  f.phi_prev = io.phi_prev;
  f.item_row0 = s_.item_row0.as<int32_t>();
  f.item_len = s_.item_len.as<int32_t>();
  f.items = items;
  f.n_heads = cfg().n_heads;
  f.phi = io.phi;
  f.lvl = io.lvl;
  f.cmin = io.cmin;
  f.smin = io.smin;
  return cuda::launch_field(f, stream_);
}

int CudaBackendImpl::splits(int rows, int max_count) const {
  if (options_.attention_splits > 0) return options_.attention_splits;
  return cuda::attention_splits(rows * cfg().n_heads, max_count * cache_.shape().page_slots);
}

// Before any launch of the step: a captured step may not allocate.
absl::Status CudaBackendImpl::reserve_partial(int rows, int max_count) {
  const size_t pairs = static_cast<size_t>(rows) * cfg().n_heads;
  return s_.partial.reserve(pairs * splits(rows, max_count) * (cfg().head_dim + 2) * 4);
}

absl::Status CudaBackendImpl::attend(int layer, const LayerIo& io, const cuda::BatchLayout& layout,
                                     int items) {
  cuda::AttentionArgs a;
  a.qkv = io.qkv;
  a.qkv_stride = qkv_stride();
  a.phi = io.phi;
  a.lvl = io.lvl;
  a.cmin = io.cmin;
  a.row_item = s_.row_item.as<int32_t>();
  a.item_row0 = s_.item_row0.as<int32_t>();
  a.item_len = s_.item_len.as<int32_t>();
  a.item_pos0 = s_.item_pos0.as<int32_t>();
  a.thr = io.thr;
  a.beta = weights_.layers()[layer].beta;
  a.page_ids = io.page_ids;
  a.page_off = io.page_off;
  a.page_cnt = io.page_cnt;
  a.rows = layout.rows;
  a.items = items;
  a.n_heads = cfg().n_heads;
  a.splits = splits(layout.rows, io.max_count);
  a.partial = s_.partial.as<float>();
  a.out = s_.attn.as<float>();
  a.retired = io.retired;
  a.tc_tiles = io.tc_tiles;
  a.n_tc_tiles = io.n_tc_tiles;
  return cuda::launch_attention(a, pool_, stream_);
}

absl::Status CudaBackendImpl::mlp_block(int layer, int rows) {
  const cuda::DeviceLayer& w = weights_.layers()[layer];
  FPA_RETURN_IF_ERROR(cuda::launch_rmsnorm(s_.h.as<float>(), nullptr, w.mlp_norm, rows,
                                           cfg().d_model, cfg().norm_eps, s_.x.as<float>(),
                                           stream_));
  FPA_RETURN_IF_ERROR(gemm_.linear(w.gate_up, s_.x.as<float>(), rows, s_.gate_up.as<float>()));
  FPA_RETURN_IF_ERROR(
      cuda::launch_swiglu(s_.gate_up.as<float>(), rows, cfg().d_ff, s_.act.as<float>(), stream_));
  return gemm_.linear(w.down, s_.act.as<float>(), rows, s_.h.as<float>(), /*accumulate=*/true);
}

absl::Status CudaBackendImpl::logits_launches(const cuda::BatchLayout& layout) {
  const int out_rows = static_cast<int>(layout.out_rows.size());
  FPA_RETURN_IF_ERROR(cuda::launch_rmsnorm(s_.h.as<float>(), s_.out_rows.as<int32_t>(),
                                           weights_.final_norm(), out_rows, cfg().d_model,
                                           cfg().norm_eps, s_.x_out.as<float>(), stream_));
  return gemm_.linear(weights_.lm_head(), s_.x_out.as<float>(), out_rows, s_.logits.as<float>());
}

absl::Status CudaBackendImpl::download_logits(const cuda::BatchLayout& layout,
                                              std::span<float> logits) {
  const size_t n = layout.out_rows.size() * static_cast<size_t>(cfg().vocab_size);
  FPA_RETURN_IF_ERROR(cuda_status(
      cudaMemcpyAsync(logits.data(), s_.logits.as<float>(), n * 4, cudaMemcpyDeviceToHost, stream_),
      "logits copy"));
  return cuda_status(cudaStreamSynchronize(stream_), "forward");
}

absl::StatusOr<std::vector<int32_t>> CudaBackendImpl::live_positions(cache::SeqId seq, int layer,
                                                                     int head) {
  std::lock_guard lock(mu_);
  std::span<const int32_t> pages = cache_.pages(seq, layer, head);
  DeviceBuffer ids, out;
  FPA_RETURN_IF_ERROR(upload(ids, pages.data(), pages.size(), stream_));
  std::vector<int32_t> pos(pages.size() * cache_.shape().page_slots);
  FPA_RETURN_IF_ERROR(out.reserve(pos.size() * 4));
  FPA_RETURN_IF_ERROR(cuda::launch_gather_pos(
      pool_, ids.as<int32_t>(), static_cast<int>(pages.size()), out.as<int32_t>(), stream_));
  FPA_RETURN_IF_ERROR(cuda_status(cudaMemcpyAsync(pos.data(), out.as<int32_t>(), pos.size() * 4,
                                                  cudaMemcpyDeviceToHost, stream_),
                                  "pos copy"));
  FPA_RETURN_IF_ERROR(cuda_status(cudaStreamSynchronize(stream_), "live positions"));
  std::erase_if(pos, [](int32_t p) { return p < 0; });
  std::sort(pos.begin(), pos.end());
  return pos;
}

absl::Status CudaBackendImpl::append_synthetic_keys(cache::SeqId seq, int32_t start_pos,
                                                    int n_tokens, float phi_step, int keep_last) {
  std::lock_guard lock(mu_);
  if (!cache_.reserve(seq, std::min(keep_last, n_tokens))) {
    return absl::ResourceExhaustedError("KV cache too small for the synthetic context");
  }
  absl::Cleanup unreserve = [&] { cache_.unreserve(seq); };
  const int page_slots = cache_.shape().page_slots;
  // The keys go in through the cache's side door (no kernel computed them), and reach the pool
  // the way a step's do: queued as each layer's edits, replayed with hashed k and v.
  edits_.clear();
  for (int l = 0; l < cfg().n_layers; ++l) {
    cache::LayerEdits edits;
    for (int h = 0; h < cfg().n_heads; ++h) {
      const float phi0 = cache_.last_phi(seq, l, h);
      for (const cuda::SyntheticKey& key :
           cuda::synthetic_walk(n_tokens, phi0, phi_step, keep_last)) {
        const int32_t pos = start_pos + key.offset;
        const size_t before = cache_.pages(seq, l, h).size();
        absl::StatusOr<cache::SlotRef> slot =
            cache::StreamAccess(cache_).insert(seq, l, h, pos, key.lvl, nullptr, nullptr, key.m);
        if (!slot.ok()) return slot.status();
        if (cache_.pages(seq, l, h).size() > before) edits.reset_pages.push_back(slot->page);
        edits.writes.push_back(
            cuda::KeyWrite{slot->page * page_slots + slot->slot, 0, h, pos, key.lvl, key.m});
      }
      cache::StreamAccess(cache_).set_last_phi(seq, l, h, phi0 + phi_step * n_tokens);
    }
    edits_.append(edits, 0);
  }
  FPA_RETURN_IF_ERROR(replay_edits(static_cast<uint32_t>(seq * 7919 + start_pos)));
  return cuda_status(cudaStreamSynchronize(stream_), "synthetic keys");
}

absl::Status check_cache(const Model& model, cache::KvCache& cache, const CudaOptions& options) {
  const ModelConfig& c = model.config();
  const cache::CacheShape& s = cache.shape();
  if (s.n_layers != c.n_layers || s.n_heads != c.n_heads || s.head_dim != c.head_dim) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cache shape (layers ", s.n_layers, ", heads ", s.n_heads, ", head_dim ", s.head_dim,
        ") does not match the model (", c.n_layers, ", ", c.n_heads, ", ", c.head_dim, ")"));
  }
  // A host-storage cache would insist on host copies of k and v, which this backend never makes.
  if (cache.page(0).k != nullptr) {
    return absl::InvalidArgumentError(
        "the cuda backend needs a KvCache created with host_storage=false (k and v live on the "
        "device)");
  }
  if (s.kv_bytes != kv_bytes(options)) {
    return absl::InvalidArgumentError(
        absl::StrCat("the cuda pool stores ", kv_bytes(options), "-byte keys and values (",
                     options.half_precision ? "bf16" : "float32", "), the cache counts ",
                     s.kv_bytes, ": create it with kv_bytes = kv_bytes(options)"));
  }
  if (c.head_dim > cuda::kMaxHeadDim) {
    return absl::UnimplementedError(absl::StrCat("the cuda backend supports head_dim up to ",
                                                 cuda::kMaxHeadDim, ", not ", c.head_dim));
  }
  return absl::OkStatus();
}

}  // namespace

bool cuda_device_available() {
  int count = 0;
  // Without a driver this fails (cudaErrorInsufficientDriver / NoDevice): no device.
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

absl::StatusOr<std::unique_ptr<CudaBackend>> create_cuda_backend(const Model& model,
                                                                 cache::KvCache& cache,
                                                                 const CudaOptions& options) {
  if (!cuda_device_available()) {
    return absl::UnavailableError("no CUDA device is available");
  }
  // TODO(cuda): upload the kept bf16 bits as they are; the device weights round from float32.
  if (keeps_bf16(model) || keeps_int8(model)) {
    return absl::FailedPreconditionError(
        "cuda backend: the model was loaded keeping its bf16 or int8 weights as stored (for the "
        "CPU backend); load it without LoadOptions::keep_bf16 / keep_int8");
  }
  FPA_RETURN_IF_ERROR(check_cache(model, cache, options));
  auto backend = std::make_unique<CudaBackendImpl>(model, cache, options);
  FPA_RETURN_IF_ERROR(backend->init());
  return backend;
}

absl::StatusOr<std::unique_ptr<Backend>> make_cuda_backend(const Model& model,
                                                           cache::KvCache& cache) {
  absl::StatusOr<std::unique_ptr<CudaBackend>> backend =
      create_cuda_backend(model, cache, CudaOptions{});
  if (!backend.ok()) return backend.status();
  return std::unique_ptr<Backend>(std::move(*backend));
}

}  // namespace fpa
