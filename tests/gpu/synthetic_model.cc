#include "tests/gpu/synthetic_model.h"

#include <cmath>
#include <deque>
#include <random>
#include <vector>

namespace fpa::bench {
namespace {

class SyntheticModel final : public Model {
 public:
  SyntheticModel(const SyntheticShape& s, uint32_t seed) : rng_(seed) {
    cfg_.vocab_size = 259;
    cfg_.d_model = s.d_model;
    cfg_.n_layers = s.n_layers;
    cfg_.n_heads = s.n_heads;
    cfg_.head_dim = s.head_dim;
    cfg_.d_ff = s.d_ff;
    cfg_.attention = AttentionKind::kFpa;
    cfg_.tau = 20.0f;
    tokenizer_ = make_byte_tokenizer(cfg_);
    const int a = s.n_heads * s.head_dim;
    embed_ = random(cfg_.vocab_size, s.d_model, 1.0f);
    for (int l = 0; l < s.n_layers; ++l) {
      LayerWeights w;
      w.attn_norm = ones(s.d_model);
      w.mlp_norm = ones(s.d_model);
      w.wq = random(a, s.d_model, 1.0f / std::sqrt(float(s.d_model)));
      w.wk = random(a, s.d_model, 1.0f / std::sqrt(float(s.d_model)));
      w.wv = random(a, s.d_model, 1.0f / std::sqrt(float(s.d_model)));
      w.wo = random(s.d_model, a, 0.1f / std::sqrt(float(a)));
      w.field_w = random(s.n_heads, s.d_model, 0.0f);
      w.field_b = filled(s.n_heads, -s.drift);
      w.beta.assign(s.n_heads, 1.0f);
      w.w_gate = random(s.d_ff, s.d_model, 1.0f / std::sqrt(float(s.d_model)));
      w.w_up = random(s.d_ff, s.d_model, 1.0f / std::sqrt(float(s.d_model)));
      w.w_down = random(s.d_model, s.d_ff, 0.1f / std::sqrt(float(s.d_ff)));
      layers_.push_back(std::move(w));
    }
    final_norm_ = ones(s.d_model);
  }

  const ModelConfig& config() const override { return cfg_; }
  const Matrix& embed() const override { return embed_; }
  const std::vector<LayerWeights>& layers() const override { return layers_; }
  std::span<const float> final_norm() const override { return final_norm_; }
  const Matrix& lm_head() const override { return embed_; }

 private:
  Matrix random(int rows, int cols, float scale) {
    std::vector<float>& v = storage_.emplace_back(static_cast<size_t>(rows) * cols);
    std::uniform_real_distribution<float> u(-scale, scale);
    for (float& x : v) x = u(rng_);
    return Matrix{v.data(), rows, cols};
  }
  std::span<const float> filled(int n, float value) {
    return storage_.emplace_back(static_cast<size_t>(n), value);
  }
  std::span<const float> ones(int n) { return filled(n, 1.0f); }

  std::mt19937 rng_;
  std::deque<std::vector<float>> storage_;  // stable addresses for the views
  ModelConfig cfg_;
  Matrix embed_;
  std::vector<LayerWeights> layers_;
  std::span<const float> final_norm_;
};

}  // namespace

std::unique_ptr<Model> make_synthetic_model(const SyntheticShape& shape, uint32_t seed) {
  return std::make_unique<SyntheticModel>(shape, seed);
}

}  // namespace fpa::bench
