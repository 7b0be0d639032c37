#include "kernels/cpu/decode_sweep.h"

#include <algorithm>

#include "kernels/cpu/parallel.h"

namespace fpa::cpu {

void DecodeSweep::run(ThreadPool* pool, cache::KvView& cache, int head_dim,
                      std::span<const DecodeStream> streams) {
  const int threads = pool != nullptr ? std::max(1, pool->threads()) : 1;
  const int ps = cache.shape().page_slots;
  plan(streams, threads, ps, head_dim);
  long work = 0;  // multiply-adds: keys x head_dim, twice
  for (const DecodeStream& s : streams) work += 2L * (std::ssize(s.pages) * ps + 1) * head_dim;
  parallel_for(pool, threads, work, [&](int r) { sweep(r, cache, head_dim, streams); });
  parallel_for(pool, static_cast<int>(shared_.size()), work / 16,
               [&](int i) { merge(shared_[i], cache, head_dim, streams[shared_[i]]); });
}

// The streams' runs of consecutive pages (segments, numbered stream by stream), sorted by first
// page and cut into one share of about equal pages a thread; scores_ laid out for the streams
// whose query counts.
// TODO(issue 26): the shares end a median 0.08 ms apart in a batch-8 step's layer (of 0.75);
// ranges that shrink as they go, taken in turn, balanced them but gave the order's gain back.
void DecodeSweep::plan(std::span<const DecodeStream> streams, int threads, int page_slots,
                       int head_dim) {
  runs_.clear();
  first_segment_.clear();
  score_at_.clear();
  int64_t pages = 0, scores = 0;
  for (size_t s = 0; s < streams.size(); ++s) {
    // The cache's page lists, a few lines apart each: a miss per stream, asked for ahead.
    if (s + 8 < streams.size()) __builtin_prefetch(streams[s + 8].pages.data());
    first_segment_.push_back(static_cast<int>(runs_.size()));
    const std::span<const int32_t> ids = streams[s].pages;
    const bool counts = streams[s].mass.counts(0);
    for (size_t p = 0; p < ids.size(); ++p) {
      if (p == 0 || ids[p] != ids[p - 1] + 1) {
        runs_.push_back({ids[p], 0, static_cast<int>(s), static_cast<int>(runs_.size())});
        score_at_.push_back(counts ? scores + static_cast<int64_t>(p) : -1);
      }
      ++runs_.back().count;
    }
    pages += std::ssize(ids);
    if (counts) scores += std::ssize(ids);
  }
  first_segment_.push_back(static_cast<int>(runs_.size()));
  std::sort(runs_.begin(), runs_.end(),
            [](const Run& a, const Run& b) { return a.first < b.first; });
  cut_.assign(1, 0);
  int64_t seen = 0;
  for (size_t i = 0; i < runs_.size(); ++i) {
    seen += runs_[i].count;
    while (std::ssize(cut_) < threads && seen * threads > pages * std::ssize(cut_)) {
      cut_.push_back(static_cast<int>(i + 1));
    }
  }
  while (std::ssize(cut_) <= threads) cut_.push_back(static_cast<int>(runs_.size()));
  settle(static_cast<int>(streams.size()));
  parts_.resize(runs_.size());
  rows_.resize(runs_.size() * head_dim);
  scores_.resize(static_cast<size_t>(scores) * page_slots);
}

// Who merges each stream: the range that reads all its segments, after its last one (then the
// parts are in that thread's cache), or, where two ranges read them, the loop after the sweep
// (shared_). A count of segments left per stream, taken down by each range under a lock, cost
// about 2% of a batch-8 step: each locked decrement waited for the kernel's stores to drain.
void DecodeSweep::settle(int streams) {
  last_.assign(streams, -1);
  first_.assign(streams, -1);
  for (int i = 0; i < std::ssize(runs_); ++i) {
    const int s = runs_[i].stream;
    if (first_[s] < 0) first_[s] = i;
    last_[s] = i;
  }
  const auto range = [&](int i) { return std::upper_bound(cut_.begin(), cut_.end(), i); };
  shared_.clear();
  for (int s = 0; s < streams; ++s) {
    if (last_[s] >= 0 && range(first_[s]) != range(last_[s])) shared_.push_back(s), last_[s] = -1;
  }
}

// Range r's segments in the pool's order, the next one's query and the one after that's stream
// asked for while this one is read (the plan's lines come from the core that wrote them), and the
// streams it merges (settle); the streams without a page are merged by range s % ranges.
void DecodeSweep::sweep(int r, cache::KvView& cache, int head_dim,
                        std::span<const DecodeStream> streams) {
  const int ps = cache.shape().page_slots;
  const int64_t stride = cache.page_stride();
  const int end = cut_[r + 1];
  const auto run_of = [&](int i) {
    return i < end ? PageRun{cache.page(runs_[i].first), runs_[i].count, stride} : PageRun{};
  };
  PageRun now = run_of(cut_[r]);
  for (int i = cut_[r]; i < end; ++i) {
    const Run& run = runs_[i];
    const PageRun next = run_of(i + 1);
    if (i + 2 < end) __builtin_prefetch(&streams[runs_[i + 2].stream]);
    if (i + 1 < end) {
      for (int d = 0; d < head_dim; d += 16) __builtin_prefetch(streams[runs_[i + 1].stream].q + d);
    }
    const DecodeStream& s = streams[run.stream];
    const int g = run.segment;
    float* scores = score_at_[g] < 0 ? nullptr : scores_.data() + score_at_[g] * ps;
    parts_[g] = decode_segment(s.q, s.phi, s.pen, head_dim, now, ps,
                               rows_.data() + static_cast<size_t>(g) * head_dim, scores, next);
    if (last_[run.stream] == i) merge(run.stream, cache, head_dim, s);
    now = next;
  }
  for (size_t s = r; s < streams.size(); s += cut_.size() - 1) {
    if (first_segment_[s] == first_segment_[s + 1]) {
      merge(static_cast<int>(s), cache, head_dim, streams[s]);
    }
  }
}

// Stream s's parts with its own key into its output, and its keys' attention mass recorded.
void DecodeSweep::merge(int s, cache::KvView& cache, int head_dim, const DecodeStream& stream) {
  const int g0 = first_segment_[s], g1 = first_segment_[s + 1];
  const DecodeTotal total =
      decode_merge(stream.q, stream.own, head_dim, std::span(parts_).subspan(g0, g1 - g0),
                   rows_.data() + static_cast<size_t>(g0) * head_dim, stream.out);
  const bool counts = stream.mass.counts(0);
  *stream.own_mass = counts ? total.own : 0.0f;
  if (!counts || g0 == g1) return;
  std::vector<cache::PageView> views;
  for (int32_t id : stream.pages) views.push_back(cache.page(id));
  decode_record({views, cache.shape().page_slots, stream.mass},
                scores_.data() + score_at_[g0] * cache.shape().page_slots, total.max, total.inv);
}

}  // namespace fpa::cpu
