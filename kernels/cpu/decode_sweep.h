// A layer's decode attention read in the order its pages lie in the pool. A stream's pages lie in
// a few runs of consecutive pages (cache/page_ledger.cc), and no stream's run follows another's
// in the order the streams are numbered, so a thread that reads stream after stream jumps at
// every run, and the hardware prefetcher starts over each time: with 2 threads the kernel read
// 38-54 GB/s over streams apart where it reads 65 (the DRAM's rate) over the same pages read in
// order (bench/RESULTS.md, 2026-12-06, sixth session). Here each run of a stream's pages is a
// segment, the segments are sorted by their first page, and each thread reads a contiguous share
// of them from start to end; each stream's parts are then merged with its own key.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "cache/kv_view.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/thread_pool.h"

namespace fpa::cpu {

// One decode query of a stream (sequence, layer, head) and where its results go.
struct DecodeStream {
  std::span<const int32_t> pages;  // the stream's pages (KvView::pages)
  const float* q = nullptr;
  OwnKey own;
  float phi = 0.0f;
  Penalty pen;
  MassRows mass;
  float* out = nullptr;       // [head_dim]
  float* own_mass = nullptr;  // the own key's probability where the query counts, else 0
};

class DecodeSweep {
 public:
  // decode_attention of every stream (the same results but for the order of the sums), on the
  // pool's threads.
  void run(ThreadPool* pool, cache::KvView& cache, int head_dim,
           std::span<const DecodeStream> streams);

 private:
  // A segment: a run of consecutive pages of one stream.
  struct Run {
    int32_t first = 0;  // its first page
    int count = 0;
    int stream = 0;
    int segment = 0;  // its number, the streams' segments counted stream by stream
  };

  void plan(std::span<const DecodeStream> streams, int threads, int page_slots, int head_dim);
  void settle(int streams);
  void sweep(int range, cache::KvView& cache, int head_dim, std::span<const DecodeStream> streams);
  void merge(int s, cache::KvView& cache, int head_dim, const DecodeStream& stream);

  std::vector<Run> runs_;           // sorted by first page
  std::vector<int> first_segment_;  // stream -> its first segment; one past the end last
  std::vector<int> cut_;            // range r reads runs_[cut_[r], cut_[r + 1])
  std::vector<int> first_, last_;   // stream -> its first and last run's place in runs_; last_
                                    // -1 where no one range reads them all (shared_)
  std::vector<int> shared_;         // the streams two ranges read, merged after the sweep
  std::vector<DecodePart> parts_;   // segment -> its part
  std::vector<float> rows_;         // segment -> its part's row [head_dim]
  std::vector<float> scores_;       // segment -> its slots' scores, where its query counts
  std::vector<int64_t> score_at_;   // segment -> its offset in scores_ (or -1)
};

}  // namespace fpa::cpu
