// The CPU backend: dense work through BLAS over the whole batch, attention per stream on
// the backend's thread pool, cache bookkeeping (evict, insert) on the calling thread.
#include <algorithm>
#include <limits>
#include <mutex>
#include <thread>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "kernels/backend.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/field.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/parallel.h"
#include "model/status_macros.h"

namespace fpa {
namespace {

using cache::KvCache;
using cache::PageView;

constexpr float kInf = std::numeric_limits<float>::infinity();

// One forward call's items with their token offsets in the stacked activations.
struct Batch {
  std::span<const ForwardItem> items;
  std::vector<int> offset;  // item -> first row; offset[items.size()] = total tokens
  int tokens() const { return offset.back(); }
  int len(size_t i) const { return offset[i + 1] - offset[i]; }
};

class CpuBackend : public Backend {
 public:
  CpuBackend(const Model& model, KvCache& cache, int threads)
      : model_(model), c_(model.config()), cache_(cache), pool_(threads) {}

  std::string_view name() const override { return "cpu"; }
  absl::Status forward(std::span<const ForwardItem> items, std::span<float> logits,
                       ForwardTrace* trace) override;

 private:
  absl::Status validate(const Batch& b, std::span<float> logits, const ForwardTrace* t) const;
  void resize(int n);
  absl::Status attention_block(int l, const Batch& b);
  void project(const LayerWeights& w, const Batch& b);
  void walk_field(int l, const Batch& b);
  absl::Status cache_decode_keys(int l, const Batch& b);
  void gather_pages(int l, const Batch& b);
  void attend(int l, const Batch& b);
  absl::Status cache_chunk_keys(int l, const Batch& b);
  void mlp_block(const LayerWeights& w, int n);
  void write_logits(const Batch& b, std::span<float> logits, bool all);

  int width() const { return c_.n_heads * c_.head_dim; }
  size_t stream(size_t item, int head) const { return item * c_.n_heads + head; }

  const Model& model_;
  const ModelConfig& c_;
  KvCache& cache_;
  cpu::ThreadPool pool_;
  absl::Mutex mu_;  // one forward at a time: the buffers below are shared
  // Activations [tokens, width]; phi/lvl are [head][tokens].
  std::vector<float> h_, x_, q_, k_, v_, o_, d_, u_, phi_, lvl_, gate_, up_, acc_;
  std::vector<std::vector<PageView>> pages_;  // stream -> its cached pages
  std::vector<float> tau_;                    // item -> fpa eviction threshold (or +inf)
};

absl::Status CpuBackend::validate(const Batch& b, std::span<float> logits,
                                  const ForwardTrace* t) const {
  std::vector<cache::SeqId> seen;
  for (const ForwardItem& it : b.items) {
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
    if (const int64_t length = cache_.sequence_stats(it.seq).length; it.start_pos != length) {
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
  int64_t need = 0;
  for (size_t i = 0; i < b.items.size(); ++i) need += cache_.pages_needed(b.items[i].seq, b.len(i));
  if (need > cache_.free_pages()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "KV cache exhausted: the batch may need ", need, " pages, ", cache_.free_pages(), " free"));
  }
  return absl::OkStatus();
}

void CpuBackend::resize(int n) {
  const size_t a = static_cast<size_t>(n) * width();
  h_.resize(static_cast<size_t>(n) * c_.d_model);
  x_.resize(h_.size());
  for (auto* buf : {&q_, &k_, &v_, &o_}) buf->resize(a);
  for (auto* buf : {&d_, &u_, &phi_, &lvl_, &acc_})
    buf->resize(static_cast<size_t>(n) * c_.n_heads);
  gate_.resize(static_cast<size_t>(n) * c_.d_ff);
  up_.resize(gate_.size());
}

absl::Status CpuBackend::forward(std::span<const ForwardItem> items, std::span<float> logits,
                                 ForwardTrace* trace) {
  absl::MutexLock lock(&mu_);
  Batch b{items, {0}};
  for (const ForwardItem& it : items) b.offset.push_back(b.offset.back() + it.tokens.size());
  FPA_RETURN_IF_ERROR(validate(b, logits, trace));
  const int n = b.tokens();
  resize(n);
  const Matrix& embed = model_.embed();
  for (size_t i = 0; i < items.size(); ++i) {
    for (int t = 0; t < b.len(i); ++t) {
      std::copy_n(embed.data + static_cast<long>(items[i].tokens[t]) * c_.d_model, c_.d_model,
                  h_.data() + static_cast<long>(b.offset[i] + t) * c_.d_model);
    }
  }
  if (trace != nullptr && trace->layer_outputs != nullptr) {
    trace->layer_outputs->assign(c_.n_layers, {});
  }
  for (int l = 0; l < c_.n_layers; ++l) {
    FPA_RETURN_IF_ERROR(attention_block(l, b));
    mlp_block(model_.layers()[l], n);
    if (trace != nullptr && trace->layer_outputs != nullptr) (*trace->layer_outputs)[l] = h_;
  }
  write_logits(b, logits, trace != nullptr && trace->all_logits);
  return absl::OkStatus();
}

absl::Status CpuBackend::attention_block(int l, const Batch& b) {
  const LayerWeights& w = model_.layers()[l];
  cpu::rmsnorm(h_.data(), b.tokens(), w.attn_norm, c_.norm_eps, x_.data());
  project(w, b);
  walk_field(l, b);
  FPA_RETURN_IF_ERROR(cache_decode_keys(l, b));
  gather_pages(l, b);
  attend(l, b);
  FPA_RETURN_IF_ERROR(cache_chunk_keys(l, b));
  cpu::linear(o_.data(), b.tokens(), w.wo, h_.data(), &pool_, /*accumulate=*/true);
  return absl::OkStatus();
}

// q, k, v (RoPE for softmax models) and the field's increments d and level offsets u.
void CpuBackend::project(const LayerWeights& w, const Batch& b) {
  const int n = b.tokens(), hd = c_.head_dim, nh = c_.n_heads;
  cpu::linear(x_.data(), n, w.wq, q_.data(), &pool_);
  cpu::linear(x_.data(), n, w.wk, k_.data(), &pool_);
  cpu::linear(x_.data(), n, w.wv, v_.data(), &pool_);
  if (c_.rope_theta > 0.0f) {
    for (size_t i = 0; i < b.items.size(); ++i) {
      for (int t = 0; t < b.len(i); ++t) {
        const long row = static_cast<long>(b.offset[i] + t) * width();
        for (int h = 0; h < nh; ++h) {
          cpu::rope(q_.data() + row + h * hd, hd, b.items[i].start_pos + t, c_.rope_theta);
          cpu::rope(k_.data() + row + h * hd, hd, b.items[i].start_pos + t, c_.rope_theta);
        }
      }
    }
  }
  if (c_.attention == AttentionKind::kSoftmax) return;
  cpu::linear(x_.data(), n, w.field_w, d_.data(), nullptr);
  if (c_.free_levels) cpu::linear(x_.data(), n, w.level_w, u_.data(), nullptr);
  for (int t = 0; t < n; ++t) {
    for (int h = 0; h < nh; ++h) {
      d_[t * nh + h] += w.field_b[h];
      if (c_.free_levels) u_[t * nh + h] += w.level_b[h];
    }
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

// Decode items: evict at the new phi, then insert the new key (m = +inf), before attending.
absl::Status CpuBackend::cache_decode_keys(int l, const Batch& b) {
  const int n = b.tokens(), hd = c_.head_dim;
  const std::vector<float>& beta = model_.layers()[l].beta;
  for (size_t i = 0; i < b.items.size(); ++i) {
    if (b.len(i) != 1) continue;
    const ForwardItem& it = b.items[i];
    const long row = static_cast<long>(b.offset[i]) * width();
    for (int h = 0; h < c_.n_heads; ++h) {
      const float phi = phi_[static_cast<long>(h) * n + b.offset[i]];
      const float lvl = lvl_[static_cast<long>(h) * n + b.offset[i]];
      // Evictions leave holes; merging sparse pages returns whole pages to the pool.
      if (cache_.evict_for_step(it.seq, l, h, phi, beta[h], it.start_pos) > 0) {
        cache_.compact(it.seq, l, h);
      }
      absl::StatusOr<cache::SlotRef> slot = cache_.insert(
          it.seq, l, h, it.start_pos, lvl, k_.data() + row + h * hd, v_.data() + row + h * hd);
      if (!slot.ok()) return slot.status();
      cache_.set_last_phi(it.seq, l, h, phi);
    }
  }
  return absl::OkStatus();
}

// Each stream's pages, and each item's eviction threshold (+inf unless the fpa policy).
void CpuBackend::gather_pages(int l, const Batch& b) {
  pages_.resize(b.items.size() * c_.n_heads);
  tau_.clear();
  for (size_t i = 0; i < b.items.size(); ++i) {
    const cache::PolicyConfig& policy = cache_.policy(b.items[i].seq);
    tau_.push_back(policy.policy == cache::Policy::kFpa ? policy.tau : kInf);
    for (int h = 0; h < c_.n_heads; ++h) {
      std::vector<PageView>& views = pages_[stream(i, h)];
      views.clear();
      for (int32_t id : cache_.pages(b.items[i].seq, l, h)) views.push_back(cache_.page(id));
    }
  }
}

void CpuBackend::attend(int l, const Batch& b) {
  const int n = b.tokens(), hd = c_.head_dim, nh = c_.n_heads;
  const std::vector<float>& beta = model_.layers()[l].beta;
  const int page_slots = cache_.shape().page_slots;
  long work = 0;  // multiply-adds: queries x keys x head_dim
  for (size_t s = 0; s < pages_.size(); ++s) {
    const long len = b.len(s / nh);
    work += (static_cast<long>(pages_[s].size()) * page_slots + len) * len * hd;
  }
  cpu::parallel_for(&pool_, static_cast<int>(b.items.size()) * nh, work, [&](int s) {
    const size_t i = s / nh;
    const int h = s % nh;
    const cpu::Penalty pen{beta[h], beta[h] > 0.0f ? tau_[i] / beta[h] : kInf};
    const long off = b.offset[i];
    const long col = off * width() + h * hd;
    const cpu::CachedKeys keys{pages_[s], page_slots};
    if (b.len(i) == 1) {
      cpu::decode_attention(q_.data() + col, phi_[h * n + off], b.items[i].start_pos, pen, hd, keys,
                            o_.data() + col);
      return;
    }
    const cpu::Chunk chunk{q_.data() + col, k_.data() + col,           v_.data() + col,
                           width(),         phi_.data() + h * n + off, lvl_.data() + h * n + off,
                           b.len(i)};
    cpu::prefill_attention(chunk, pen, hd, keys, o_.data() + col, acc_.data() + h * n + off);
  });
}

// Prompt chunks, after attending: every chunk key goes in with m = the suffix-min of phi after
// it and the probability it received, then the cache evicts for the whole chunk (the fpa rule
// at the chunk's deepest dip, or a heuristic's budget).
absl::Status CpuBackend::cache_chunk_keys(int l, const Batch& b) {
  const int n = b.tokens(), hd = c_.head_dim;
  const std::vector<float>& beta = model_.layers()[l].beta;
  std::vector<float> m;
  for (size_t i = 0; i < b.items.size(); ++i) {
    const int len = b.len(i);
    if (len == 1) continue;
    const ForwardItem& it = b.items[i];
    for (int h = 0; h < c_.n_heads; ++h) {
      const long at = static_cast<long>(h) * n + b.offset[i];
      m.assign(len, kInf);
      for (int t = len - 2; t >= 0; --t) m[t] = std::min(m[t + 1], phi_[at + t + 1]);
      for (int t = 0; t < len; ++t) {
        const long row = static_cast<long>(b.offset[i] + t) * width() + h * hd;
        absl::StatusOr<cache::SlotRef> slot = cache_.insert(
            it.seq, l, h, it.start_pos + t, lvl_[at + t], k_.data() + row, v_.data() + row, m[t]);
        if (!slot.ok()) return slot.status();
        cache_.page(slot->page).acc[slot->slot] = acc_[at + t];
      }
      if (cache_.evict_for_chunk(it.seq, l, h, *std::min_element(&phi_[at], &phi_[at] + len),
                                 beta[h], it.start_pos + len - 1) > 0) {
        cache_.compact(it.seq, l, h);
      }
      cache_.set_last_phi(it.seq, l, h, phi_[at + len - 1]);
    }
  }
  return absl::OkStatus();
}

void CpuBackend::mlp_block(const LayerWeights& w, int n) {
  cpu::rmsnorm(h_.data(), n, w.mlp_norm, c_.norm_eps, x_.data());
  cpu::linear(x_.data(), n, w.w_gate, gate_.data(), &pool_);
  cpu::linear(x_.data(), n, w.w_up, up_.data(), &pool_);
  cpu::swiglu(gate_.data(), up_.data(), static_cast<long>(n) * c_.d_ff);
  cpu::linear(gate_.data(), n, w.w_down, h_.data(), &pool_, /*accumulate=*/true);
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
  cpu::rmsnorm(x_.data(), rows, model_.final_norm(), c_.norm_eps, x_.data());
  cpu::linear(x_.data(), rows, model_.lm_head(), logits.data(), &pool_);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Backend>> make_cpu_backend(const Model& model, cache::KvCache& cache,
                                                          int threads) {
  const ModelConfig& c = model.config();
  const cache::CacheShape& s = cache.shape();
  if (s.n_layers != c.n_layers || s.n_heads != c.n_heads || s.head_dim != c.head_dim) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cpu backend: cache shape (", s.n_layers, " layers, ", s.n_heads, " heads x ", s.head_dim,
        ") does not match the model (", c.n_layers, ", ", c.n_heads, " x ", c.head_dim, ")"));
  }
  static std::once_flag blas_once;
  std::call_once(blas_once, cpu::use_single_threaded_blas);
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return std::make_unique<CpuBackend>(model, cache, threads);
}

}  // namespace fpa
