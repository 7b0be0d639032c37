// The CUDA backend (issue 5): cuBLAS projections and paged FPA attention kernels.
//
// The host KvCache keeps the bookkeeping (which slot of which page holds which key, who dies
// when); the backend mirrors the slot contents in one device allocation made at start-up, indexed
// by the same page ids and slots. The cache passed in must be created with host_storage=false;
// the backend attaches itself to it as its cache::DevicePool, the one way the cache's slot edits
// (a step's resets, key writes and moves; a fork's copies, as the prefix cache makes) reach the
// device.
//
// Eviction is decided on the host, in step order, with the cache's own rule (lvl - phi >= tau/beta
// in float32), from phi values copied back (once per step for a decode step, once per layer for a
// step with prompt chunks); the attention kernel applies the same expression to the same floats
// when it updates m in place, so the device retires exactly the keys the cache frees, and a
// decode step checks the counts agree. Supported policies: fpa and none (the heuristic policies
// need per-slot information the host cache does not expose without host storage).
//
// FoX Pro's options run here as on the CPU backend: their projections join the fused GEMMs
// (projection_layout.h), the per-head norms, output gate and key/value shift are kernels of their
// own (fox_pro_ops.h), and each sequence's shift rows stay on the device (shift_rows.h).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "cache/kv_cache.h"
#include "kernels/backend.h"
#include "model/model.h"

namespace fpa {

struct CudaOptions {
  // bf16 weights and bf16 keys/values (float32 accumulation, float32 phi, lvl, m); false keeps
  // everything float32, which the parity tests use to check eviction bit for bit.
  bool half_precision = true;
  // Parts each (row, head) splits its cached keys into; 0 lets attention_splits() choose. Tests
  // force it so that short sequences run the split path (and longer ones the unsplit one).
  int attention_splits = 0;
  // A decode step (every item one token) runs all layers on the device and the cache settles them
  // after it (decode_step.h); false settles every layer before the next, as prompt chunks do.
  bool settle_after_step = true;
  // Such a step runs as one CUDA graph (step_graph.h); FPA_CUDA_SYNC=1 turns this off.
  bool graphs = true;
  // Prompt chunks attended on tensor cores where the pool allows (prefill_tc.h: bf16, head_dim a
  // multiple of 16 up to 128); false keeps the warp kernel for every row.
  bool tensor_core_prefill = true;
};

// Bytes per stored key or value element of the backend's pool: the cache it runs on must be
// created with this CacheShape::kv_bytes, so that every byte figure counts the real storage.
inline int kv_bytes(const CudaOptions& options) { return options.half_precision ? 2 : 4; }

class CudaBackend : public Backend {
 public:
  // Sorted positions of the keys the device holds live for one stream: tests compare them with
  // the host cache and the reference vectors.
  virtual absl::StatusOr<std::vector<int32_t>> live_positions(cache::SeqId seq, int layer,
                                                              int head) = 0;
  // Benchmarks: appends n_tokens synthetic keys (random k and v) to every stream of `seq` at
  // positions start_pos.., with a field falling by `phi_step` per token and tied levels, keeping
  // only the last `keep_last` of them (the others count as evicted). Lets a benchmark reach a
  // long context without running the prefill it does not measure.
  virtual absl::Status append_synthetic_keys(cache::SeqId seq, int32_t start_pos, int n_tokens,
                                             float phi_step, int keep_last) = 0;
};

absl::StatusOr<std::unique_ptr<CudaBackend>> create_cuda_backend(const Model& model,
                                                                 cache::KvCache& cache,
                                                                 const CudaOptions& options);

}  // namespace fpa
