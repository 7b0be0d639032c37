// The CPU backend: dense work through BLAS over the whole batch, attention per stream on
// the backend's thread pool, cache bookkeeping (evict, insert) on the calling thread.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <mutex>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "cache/layer_update.h"
#include "kernels/backend.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/bf16_linear.h"
#include "kernels/cpu/field.h"
#include "kernels/cpu/int8_linear.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/shift_state.h"
#include "model/status_macros.h"

namespace fpa {
namespace {

using cache::KvCache;
using cache::PageView;

// One forward call's items with their token offsets in the stacked activations.
struct Batch {
  std::span<const cache::BatchItem> items;
  std::vector<int> offset;            // item -> first row; offset[items.size()] = total tokens
  std::vector<cache::MassRule> mass;  // item -> what its policy has the kernels record in acc
  int tokens() const { return offset.back(); }
  int len(size_t i) const { return offset[i + 1] - offset[i]; }
};

// Adds the wall time since its last mark to a phase of `phases` (nothing where that is null).
class PhaseClock {
 public:
  explicit PhaseClock(StepPhases* phases) : phases_(phases), last_(now()) {}
  void mark(double StepPhases::*phase) {
    if (phases_ == nullptr) return;
    const auto t = now();
    phases_->*phase += std::chrono::duration<double>(t - last_).count();
    last_ = t;
  }

 private:
  static std::chrono::steady_clock::time_point now() { return std::chrono::steady_clock::now(); }
  StepPhases* phases_;
  std::chrono::steady_clock::time_point last_;
};

class CpuBackend : public Backend {
 public:
  CpuBackend(const Model& model, KvCache& cache, int threads, CpuWeights weights)
      : model_(model),
        c_(model.config()),
        cache_(cache),
        layout_(cache.layout()),
        pool_(threads),
        shift_(c_.n_layers, c_.n_heads * c_.head_dim) {
    if (weights == CpuWeights::kBf16) pack_weights(bf16_);
    if (weights == CpuWeights::kInt8) pack_weights(int8_);
    // A fork (a prefix-cache snapshot or hit) goes on from its source's shift rows.
    if (c_.k_shift || c_.v_shift) {
      cache_.on_fork([this](cache::SeqId from, cache::SeqId to) { shift_.copy(from, to); });
    }
  }
  ~CpuBackend() override {
    if (c_.k_shift || c_.v_shift) cache_.on_fork({});
  }

  std::string_view name() const override {
    return !bf16_.empty() ? "cpu-bf16" : !int8_.empty() ? "cpu-int8" : "cpu";
  }
  absl::Status forward(std::span<const cache::BatchItem> items, std::span<float> logits,
                       ForwardTrace* trace) override;

 private:
  template <class Packed>
  void pack_weights(absl::flat_hash_map<const Matrix*, Packed>& packed);
  void linear(const float* x, int n, const Matrix& w, float* y, bool accumulate = false);
  using Product = std::pair<const Matrix*, float*>;
  void linear_each(const float* x, int n, std::initializer_list<Product> products);
  absl::Status validate(const Batch& b, std::span<float> logits, const ForwardTrace* t) const;
  void resize(int n);
  absl::Status attention_block(int l, const Batch& b, PhaseClock& clock);
  void project(const LayerWeights& w, const Batch& b, int l);
  void shift(const Matrix& gate, float* y, const Batch& b, int l, int which);
  void walk_field(int l, const Batch& b);
  void list_pages(int l, const Batch& b);
  void view_pages(int s);
  void attend(int l, const Batch& b);
  void attend_stream(int l, const Batch& b, int s, std::span<const PageView> then);
  void prefetch_rows(const Batch& b, int s) const;
  void norm_heads(float* x, int n, std::span<const float> weight, float eps);
  void gate_output(const LayerWeights& w, int n);
  absl::Status update_cache(int l, const Batch& b);
  void mlp_block(const LayerWeights& w, int n);
  void norm(const float* x, int n, std::span<const float> weight, float* y);
  void write_logits(const Batch& b, std::span<float> logits, bool all);

  int width() const { return c_.n_heads * c_.head_dim; }
  size_t stream(size_t item, int head) const { return item * c_.n_heads + head; }

  const Model& model_;
  const ModelConfig& c_;
  KvCache& cache_;
  const cache::PageLayout& layout_;  // the cache's pool, which never moves
  cpu::ThreadPool pool_;
  absl::Mutex mu_;  // one forward at a time: the buffers below are shared
  // Activations [tokens, width]; phi/lvl are [head][tokens].
  std::vector<float> h_, x_, q_, k_, v_, o_, d_, u_, phi_, lvl_, gate_, up_, acc_, alpha_;
  std::vector<int> pos_;                            // row -> its token's position
  std::vector<std::span<const int32_t>> page_ids_;  // stream -> its cached pages (the cache's)
  std::vector<std::vector<PageView>> pages_;        // stream -> their views (view_pages)
  std::vector<char> viewed_;                        // stream -> pages_ is this layer's
  std::vector<float> thr_;                          // stream -> the threshold keys are excluded at
  std::vector<cpu::Int8Output> int8_outs_;          // linear_each's products of one input
  cpu::ShiftStates shift_;                          // k_shift / v_shift models
  // With bf16 (int8) weights: each projection packed for oneDNN, by the model's matrix.
  absl::flat_hash_map<const Matrix*, cpu::Bf16Matrix> bf16_;
  absl::flat_hash_map<const Matrix*, cpu::Int8Matrix> int8_;
};

template <class Packed>
void CpuBackend::pack_weights(absl::flat_hash_map<const Matrix*, Packed>& packed) {
  for (const LayerWeights& w : model_.layers()) {
    for (const Matrix* m : projections(w)) packed.emplace(m, Packed(*m));
  }
  packed.emplace(&model_.lm_head(), Packed(model_.lm_head()));
}

void CpuBackend::linear(const float* x, int n, const Matrix& w, float* y, bool accumulate) {
  if (auto it = bf16_.find(&w); it != bf16_.end()) {
    cpu::linear_bf16(x, n, it->second, y, &pool_, accumulate);
  } else if (auto i8 = int8_.find(&w); i8 != int8_.end()) {
    cpu::linear_int8(x, n, i8->second, y, &pool_, accumulate);
  } else {
    cpu::linear(x, n, w, y, &pool_, accumulate);
  }
}

// Several products of one input: in one pass over the pool where every matrix is int8, else one
// by one.
void CpuBackend::linear_each(const float* x, int n, std::initializer_list<Product> products) {
  int8_outs_.clear();
  for (const auto& [w, y] : products) {
    auto it = int8_.find(w);
    if (it == int8_.end()) break;
    int8_outs_.push_back({&it->second, y});
  }
  if (int8_outs_.size() == products.size()) return cpu::linear_int8(x, n, int8_outs_, &pool_);
  for (const auto& [w, y] : products) linear(x, n, *w, y);
}

absl::Status CpuBackend::validate(const Batch& b, std::span<float> logits,
                                  const ForwardTrace* t) const {
  std::vector<cache::SeqId> seen;
  for (const cache::BatchItem& it : b.items) {
    if (it.tokens.empty() || it.start_pos < 0) {
      return absl::InvalidArgumentError("forward: an item has no tokens or a negative position");
    }
    for (int32_t tok : it.tokens) {
      if (tok < 0 || tok >= c_.vocab_size) {
        return absl::InvalidArgumentError(
            absl::StrCat("forward: token id ", tok, " outside [0, ", c_.vocab_size, ")"));
      }
    }
    if (std::find(seen.begin(), seen.end(), it.seq) != seen.end()) {
      return absl::InvalidArgumentError(absl::StrCat("forward: sequence ", it.seq, " twice"));
    }
    // Keys go in at increasing positions: an item must continue where its sequence stopped.
    if (const int64_t length = cache_.length(it.seq); it.start_pos != length) {
      return absl::InvalidArgumentError(absl::StrCat("forward: sequence ", it.seq,
                                                     " is at position ", length,
                                                     ", the item starts at ", it.start_pos));
    }
    seen.push_back(it.seq);
  }
  const size_t rows = t != nullptr && t->all_logits ? b.tokens() : b.items.size();
  if (logits.size() < rows * c_.vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat("forward: logits buffer holds ", logits.size(),
                                                   " floats, needs ", rows * c_.vocab_size));
  }
  return absl::OkStatus();
}

void CpuBackend::resize(int n) {
  const size_t a = static_cast<size_t>(n) * width();
  h_.resize(static_cast<size_t>(n) * c_.d_model);
  x_.resize(h_.size());
  for (auto* buf : {&q_, &k_, &v_, &o_}) buf->resize(a);
  for (auto* buf : {&d_, &u_, &phi_, &lvl_, &acc_, &alpha_})
    buf->resize(static_cast<size_t>(n) * c_.n_heads);
  gate_.resize(static_cast<size_t>(n) * c_.d_ff);
  up_.resize(gate_.size());
}

absl::Status CpuBackend::forward(std::span<const cache::BatchItem> items, std::span<float> logits,
                                 ForwardTrace* trace) {
  absl::MutexLock lock(&mu_);
  Batch b{items, {0}, {}};
  for (const cache::BatchItem& it : items) {
    b.offset.push_back(b.offset.back() + it.tokens.size());
    b.mass.push_back(cache_.mass_rule(it.seq));
  }
  FPA_RETURN_IF_ERROR(validate(b, logits, trace));
  if (c_.k_shift || c_.v_shift) FPA_RETURN_IF_ERROR(shift_.begin(items, cache_));
  const int n = b.tokens();
  resize(n);
  const Matrix& embed = model_.embed();
  pos_.clear();
  for (size_t i = 0; i < items.size(); ++i) {
    for (int t = 0; t < b.len(i); ++t) {
      pos_.push_back(items[i].start_pos + t);
      std::copy_n(embed.data + static_cast<long>(items[i].tokens[t]) * c_.d_model, c_.d_model,
                  h_.data() + static_cast<long>(b.offset[i] + t) * c_.d_model);
    }
  }
  if (trace != nullptr && trace->layer_outputs != nullptr) {
    trace->layer_outputs->assign(c_.n_layers, {});
  }
  PhaseClock clock(trace != nullptr ? trace->phases : nullptr);
  for (int l = 0; l < c_.n_layers; ++l) {
    FPA_RETURN_IF_ERROR(attention_block(l, b, clock));
    mlp_block(model_.layers()[l], n);
    clock.mark(&StepPhases::mlp);
    if (trace != nullptr && trace->layer_outputs != nullptr) (*trace->layer_outputs)[l] = h_;
  }
  if (c_.k_shift || c_.v_shift) shift_.end(items);
  write_logits(b, logits, trace != nullptr && trace->all_logits);
  clock.mark(&StepPhases::logits);
  return absl::OkStatus();
}

absl::Status CpuBackend::attention_block(int l, const Batch& b, PhaseClock& clock) {
  const LayerWeights& w = model_.layers()[l];
  norm(h_.data(), b.tokens(), w.attn_norm, x_.data());
  project(w, b, l);
  clock.mark(&StepPhases::project);
  walk_field(l, b);
  clock.mark(&StepPhases::field);
  list_pages(l, b);
  clock.mark(&StepPhases::pages);
  attend(l, b);
  clock.mark(&StepPhases::attend);
  FPA_RETURN_IF_ERROR(update_cache(l, b));
  clock.mark(&StepPhases::cache);
  gate_output(w, b.tokens());
  linear(o_.data(), b.tokens(), w.wo, h_.data(), /*accumulate=*/true);
  clock.mark(&StepPhases::output);
  return absl::OkStatus();
}

// q, k, v (RoPE for softmax models) and the field's increments d and level offsets u.
void CpuBackend::project(const LayerWeights& w, const Batch& b, int l) {
  const int n = b.tokens(), hd = c_.head_dim, nh = c_.n_heads;
  linear_each(x_.data(), n, {{&w.wq, q_.data()}, {&w.wk, k_.data()}, {&w.wv, v_.data()}});
  if (c_.k_shift) shift(w.k_shift, k_.data(), b, l, 0);
  if (c_.v_shift) shift(w.v_shift, v_.data(), b, l, 1);
  if (c_.qk_norm) {  // FoX Pro: GroupNorm's default eps, not norm_eps
    norm_heads(q_.data(), n, w.q_norm, 1e-5f);
    norm_heads(k_.data(), n, w.k_norm, 1e-5f);
  }
  if (c_.rope_theta > 0.0f) {
    cpu::for_token_rows(&pool_, n, 4L * n * width(), [&](int r0, int rows) {
      for (int r = r0; r < r0 + rows; ++r) {
        const long row = static_cast<long>(r) * width();
        cpu::rope(q_.data() + row, nh, hd, hd, pos_[r], c_.rope_theta);
        cpu::rope(k_.data() + row, nh, hd, hd, pos_[r], c_.rope_theta);
      }
    });
  }
  if (c_.attention == AttentionKind::kSoftmax) return;
  // The field's float32 products are too narrow (one output per head) to split by rows; with
  // free levels the two run side by side, each whole on one thread as before, so their sums are
  // the same. Side by side, a batch-1 FPA step's projection phase takes 0.98 of the time it took
  // with the two one after the other (bench/RESULTS.md, ninth session).
  const int products = c_.free_levels ? 2 : 1;
  pool_.run(products, [&](int i) {
    cpu::linear(x_.data(), n, i == 0 ? w.field_w : w.level_w, i == 0 ? d_.data() : u_.data(),
                nullptr);
  });
  for (int t = 0; t < n; ++t) {
    for (int h = 0; h < nh; ++h) {
      d_[t * nh + h] += w.field_b[h];
      if (c_.free_levels) u_[t * nh + h] += w.level_b[h];
    }
  }
}

// FoX Pro's key / value shift of y [tokens, width], each item continuing its own sequence.
void CpuBackend::shift(const Matrix& gate, float* y, const Batch& b, int l, int which) {
  linear(x_.data(), b.tokens(), gate, alpha_.data());
  for (size_t i = 0; i < b.items.size(); ++i) {
    const long off = b.offset[i];
    shift_.apply(b.items[i].seq, l, which, alpha_.data() + off * c_.n_heads, c_.n_heads,
                 y + off * width(), b.len(i));
  }
}

// RMSNorm of each head's slice of x [n, width] in place: weight is [width] (one scale per
// head) or [head_dim] (shared by every head).
void CpuBackend::norm_heads(float* x, int n, std::span<const float> weight, float eps) {
  const int hd = c_.head_dim, nh = c_.n_heads;
  const bool shared = static_cast<int>(weight.size()) == hd;
  cpu::for_token_rows(&pool_, n, 2L * n * width(), [&](int r0, int rows) {
    for (int r = r0; r < r0 + rows; ++r) {
      for (int h = 0; h < nh; ++h) {
        float* head = x + static_cast<long>(r) * width() + h * hd;
        cpu::rmsnorm(head, 1, weight.subspan(shared ? 0 : h * hd, hd), eps, head);
      }
    }
  });
}

// FoX Pro's output stage: o = norm_heads(o) (output_norm), then o *= act(ogate x)
// (output_gate), before wo.
void CpuBackend::gate_output(const LayerWeights& w, int n) {
  if (c_.output_norm) norm_heads(o_.data(), n, w.out_norm, c_.norm_eps);
  if (!c_.output_gate) return;
  linear(x_.data(), n, w.ogate, q_.data());  // q_ is free once attention has run
  const long count = static_cast<long>(n) * width();
  for (long i = 0; i < count; ++i) {
    const float g = q_[i];
    const float sig = 1.0f / (1.0f + std::exp(-g));
    o_[i] *= c_.output_gate_silu ? g * sig : sig;
  }
}

// Each stream's phi and lvl, continuing the walk from the cache's last phi.
void CpuBackend::walk_field(int l, const Batch& b) {
  const int n = b.tokens(), nh = c_.n_heads;
  for (size_t i = 0; i < b.items.size(); ++i) {
    const int off = b.offset[i];
    for (int h = 0; h < nh; ++h) {
      float* phi = phi_.data() + static_cast<long>(h) * n + off;
      float* lvl = lvl_.data() + static_cast<long>(h) * n + off;
      if (c_.attention == AttentionKind::kSoftmax) {  // no walk: beta = 0 never reads it
        std::fill_n(phi, b.len(i), 0.0f);
        std::fill_n(lvl, b.len(i), 0.0f);
        continue;
      }
      cpu::field_walk(c_.attention, d_.data() + static_cast<long>(off) * nh,
                      c_.free_levels ? u_.data() + static_cast<long>(off) * nh : nullptr, b.len(i),
                      nh, h, cache_.last_phi(b.items[i].seq, l, h), phi, lvl);
    }
  }
}

// Each stream's page list and the threshold its policy has the kernels exclude keys at: the
// cache's look-ups, on one thread (each takes the cache's shared lock, one line that both cores
// would pass between their L3s at every call).
void CpuBackend::list_pages(int l, const Batch& b) {
  page_ids_.resize(b.items.size() * c_.n_heads);
  thr_.resize(page_ids_.size());
  const std::vector<float>& beta = model_.layers()[l].beta;
  for (size_t i = 0; i < b.items.size(); ++i) {
    for (int h = 0; h < c_.n_heads; ++h) {
      thr_[stream(i, h)] = cache_.threshold(b.items[i].seq, beta[h]);
      page_ids_[stream(i, h)] = cache_.pages(b.items[i].seq, l, h);
    }
  }
}

// Stream s's page views: built by the thread that attends the stream, so they are in its cache.
// Built for all streams on one thread before, with the look-ups, they took 0.13 ms a layer of a
// batch-8 step (about 5% of it) with the other thread waiting (bench/RESULTS.md, fifth session).
void CpuBackend::view_pages(int s) {
  std::vector<PageView>& views = pages_[s];
  views.resize(page_ids_[s].size());
  std::ranges::transform(page_ids_[s], views.begin(),
                         [this](int32_t id) { return layout_.view(id); });
}

// Each thread views the pages of the stream it reads next and asks for that stream's rows while
// it attends its current one, so its decode kernel fetches the next stream's first pages while
// it ends its own (the rows: about 3% of a batch-8 step's call, bench/RESULTS.md, fifth session).
// A stream is viewed by the thread that attends it (the one that took it as its next, or its
// first), so each flag of viewed_ is read and written by one thread.
// TODO(issue 26): cold, the kernel pays at each jump between a stream's runs of pages (2-3 runs a
// stream, no stream's run after another's): read in the pool's order a batch-8 call took 0.85-0.95
// of the time, but that sweep cut streams where their pages jump, so outputs depended on where
// the pages lay (bench/RESULTS.md, 2026-12-06, sixth session); cut at fixed places of each page
// list instead, each span read whole.
void CpuBackend::attend(int l, const Batch& b) {
  const int nh = c_.n_heads, page_slots = cache_.shape().page_slots;
  const int streams = static_cast<int>(page_ids_.size());
  pages_.resize(streams);
  viewed_.assign(streams, 0);
  long work = 0;  // multiply-adds: queries x keys x head_dim
  for (int s = 0; s < streams; ++s) {
    const long len = b.len(s / nh);
    work += (static_cast<long>(page_ids_[s].size()) * page_slots + len) * len * c_.head_dim;
  }
  cpu::parallel_for_ahead(&pool_, streams, work, [&](int s, int next) {
    if (!viewed_[s]) view_pages(s);
    if (next >= 0) {
      view_pages(next);
      viewed_[next] = 1;
      prefetch_rows(b, next);
    }
    attend_stream(l, b, s, next >= 0 ? pages_[next] : std::span<const PageView>());
  });
}

// The rows stream s reads first and writes: its (first) query, key and value, which the layer's
// products wrote on either core, and its output row.
void CpuBackend::prefetch_rows(const Batch& b, int s) const {
  const long col = b.offset[s / c_.n_heads] * width() + (s % c_.n_heads) * c_.head_dim;
  for (int d = 0; d < c_.head_dim; d += 16) {
    __builtin_prefetch(q_.data() + col + d);
    __builtin_prefetch(k_.data() + col + d);
    __builtin_prefetch(v_.data() + col + d);
    __builtin_prefetch(o_.data() + col + d, 1);
  }
}

// Attention of stream s (item s / n_heads, head s % n_heads); `then`: the pages read next.
void CpuBackend::attend_stream(int l, const Batch& b, int s, std::span<const PageView> then) {
  const int n = b.tokens(), hd = c_.head_dim, nh = c_.n_heads;
  const size_t i = s / nh;
  const int h = s % nh;
  const cpu::Penalty pen{model_.layers()[l].beta[h], thr_[s]};
  const long off = b.offset[i];
  const long col = off * width() + h * hd;
  const auto [first, end] = b.mass[i].rows(b.items[i].start_pos, b.len(i));
  const cpu::CachedKeys keys{pages_[s], cache_.shape().page_slots, {b.mass[i].mode, first, end}};
  if (b.len(i) == 1) {
    const cpu::OwnKey own{k_.data() + col, v_.data() + col};
    acc_[h * n + off] = cpu::decode_attention(q_.data() + col, phi_[h * n + off], own, pen, hd,
                                              keys, o_.data() + col, then);
    return;
  }
  const cpu::Chunk chunk{q_.data() + col, k_.data() + col,           v_.data() + col,
                         width(),         phi_.data() + h * n + off, lvl_.data() + h * n + off,
                         b.len(i)};
  cpu::prefill_attention(chunk, pen, hd, keys, o_.data() + col, acc_.data() + h * n + off);
}

// The cache evicts, inserts the step's keys (with the attention mass they got) and
// compacts, as for every backend, its sequences shared out on the pool.
// TODO(issue 26): shared, the FPA model's update takes half its serial time, but the softmax
// model's (inserts only) about 30% more (bench/RESULTS.md, sixth session): what its threads
// contend on is not found yet.
absl::Status CpuBackend::update_cache(int l, const Batch& b) {
  const cache::LayerRows rows{phi_.data(), lvl_.data(), acc_.data(), 1,
                              b.tokens(),  k_.data(),   v_.data(),   width()};
  const cache::Workers workers{pool_.threads(),
                               [&](int n, const std::function<void(int)>& f) { pool_.run(n, f); }};
  return cache::apply_layer(cache_, l, b.items, model_.layers()[l].beta, rows, &workers).status();
}

void CpuBackend::mlp_block(const LayerWeights& w, int n) {
  norm(h_.data(), n, w.mlp_norm, x_.data());
  linear_each(x_.data(), n, {{&w.w_gate, gate_.data()}, {&w.w_up, up_.data()}});
  cpu::for_token_rows(&pool_, n, 8L * n * c_.d_ff, [&](int r0, int rows) {
    const long at = static_cast<long>(r0) * c_.d_ff;
    cpu::swiglu(gate_.data() + at, up_.data() + at, static_cast<long>(rows) * c_.d_ff);
  });
  linear(gate_.data(), n, w.w_down, h_.data(), /*accumulate=*/true);
}

// Token rows on the pool: a prefill chunk's or a large batch's norms are worth splitting, a
// small batch's are not (kMinParallelWork).
void CpuBackend::norm(const float* x, int n, std::span<const float> weight, float* y) {
  const int d = c_.d_model;
  cpu::for_token_rows(&pool_, n, 2L * n * d, [&](int r0, int rows) {
    const long at = static_cast<long>(r0) * d;
    cpu::rmsnorm(x + at, rows, weight, c_.norm_eps, y + at);
  });
}

void CpuBackend::write_logits(const Batch& b, std::span<float> logits, bool all) {
  int rows = b.tokens();
  if (!all) {  // only each item's last token
    rows = static_cast<int>(b.items.size());
    for (int i = 0; i < rows; ++i) {
      std::copy_n(h_.data() + static_cast<long>(b.offset[i + 1] - 1) * c_.d_model, c_.d_model,
                  x_.data() + static_cast<long>(i) * c_.d_model);
    }
  } else {
    x_ = h_;
  }
  norm(x_.data(), rows, model_.final_norm(), x_.data());
  linear(x_.data(), rows, model_.lm_head(), logits.data());
}

// Whether this CPU and the model's kept weights (LoadOptions) can run `weights`.
absl::Status check_weights(const Model& model, CpuWeights weights) {
  if (weights == CpuWeights::kBf16 && !cpu::cpu_has_bf16()) {
    return absl::FailedPreconditionError(
        "cpu backend: bf16 weights need a CPU with AVX512-BF16, which this one lacks; use "
        "float32 weights");
  }
  if (weights == CpuWeights::kInt8 && !cpu::cpu_has_vnni()) {
    return absl::FailedPreconditionError(
        "cpu backend: int8 weights need a CPU with AVX512-VNNI, which this one lacks; use "
        "float32 (or bf16) weights");
  }
  if (weights == CpuWeights::kF32 && keeps_bf16(model)) {
    return absl::FailedPreconditionError(
        "cpu backend: the model was loaded keeping its bf16 weights as stored; float32 weights "
        "need it loaded without LoadOptions::keep_bf16");
  }
  if (weights != CpuWeights::kInt8 && keeps_int8(model)) {
    return absl::FailedPreconditionError(
        "cpu backend: the model was loaded keeping its int8 weights as stored; other weights "
        "need it loaded without LoadOptions::keep_int8");
  }
  return absl::OkStatus();
}

}  // namespace

CpuWeights cpu_weights_named(std::string_view name) {
  return name == "bf16" ? CpuWeights::kBf16 : name == "int8" ? CpuWeights::kInt8 : CpuWeights::kF32;
}

absl::StatusOr<std::unique_ptr<Backend>> make_cpu_backend(const Model& model, cache::KvCache& cache,
                                                          int threads, CpuWeights weights) {
  const ModelConfig& c = model.config();
  const cache::CacheShape& s = cache.shape();
  if (s.n_layers != c.n_layers || s.n_heads != c.n_heads || s.head_dim != c.head_dim) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cpu backend: cache shape (", s.n_layers, " layers, ", s.n_heads, " heads x ", s.head_dim,
        ") does not match the model (", c.n_layers, ", ", c.n_heads, " x ", c.head_dim, ")"));
  }
  FPA_RETURN_IF_ERROR(check_weights(model, weights));
  static std::once_flag blas_once;
  std::call_once(blas_once, cpu::use_single_threaded_blas);
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return std::make_unique<CpuBackend>(model, cache, threads, weights);
}

}  // namespace fpa
