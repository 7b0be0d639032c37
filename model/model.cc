// Model::load: config.json + memory-mapped model.safetensors, every tensor checked against the
// config before any weight is used.
#include "model/model.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <deque>
#include <optional>
#include <set>
#include <tuple>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "model/bf16.h"
#include "model/config.h"
#include "model/json_fields.h"
#include "model/safetensors.h"
#include "model/status_macros.h"
#include "model/tensor_files.h"
#include "model/weight_names.h"

namespace fpa {
namespace {

class LoadedModel : public Model {
 public:
  const ModelConfig& config() const override { return config_; }
  const Matrix& embed() const override { return embed_; }
  const std::vector<LayerWeights>& layers() const override { return layers_; }
  std::span<const float> final_norm() const override { return final_norm_; }
  const Matrix& lm_head() const override { return config_.tie_embeddings ? embed_ : lm_head_; }

  absl::Status load(const std::string& dir, LoadOptions options);

 private:
  absl::StatusOr<const float*> tensor(const std::string& name, std::vector<int64_t> shape);
  absl::Status matrix(const std::string& name, int rows, int cols, Matrix* out);
  // A projection: kept as the file's BF16 bits (I8 values and scales) when options_ say so and
  // the file stores BF16 (I8); an I8 one not kept is widened to float32.
  absl::Status projection(const std::string& name, int rows, int cols, Matrix* out);
  absl::Status int8_projection(const std::string& name, const TensorView& t, int rows, int cols,
                               Matrix* out);
  absl::Status vector(const std::string& name, int n, std::span<const float>* out);
  absl::Status load_layer(int l, LayerWeights* w);
  absl::Status load_pro_options(const LayerNames& n, LayerWeights* w);
  absl::Status check_no_extra_tensors() const;

  ModelConfig config_;
  LoadOptions options_;
  std::optional<TensorFiles> files_;
  std::deque<std::vector<float>> converted_;  // F16/BF16/unaligned tensors, as float32
  std::set<std::string> used_;
  Matrix embed_, lm_head_;
  std::vector<LayerWeights> layers_;
  std::span<const float> final_norm_;
};

// The top and bottom halves of a matrix's rows, as views.
std::pair<Matrix, Matrix> split_rows(const Matrix& m) {
  const int rows = m.rows / 2;
  const size_t offset = static_cast<size_t>(rows) * m.cols;
  Matrix top = m, bottom = m;
  top.rows = bottom.rows = rows;
  if (m.data) bottom.data += offset;
  if (m.bf16) bottom.bf16 += offset;
  if (m.i8) bottom.i8 += offset;
  if (m.scale) bottom.scale += rows;
  return {top, bottom};
}

// softplus as PyTorch computes it (linear above 20).
float softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }

absl::StatusOr<const float*> LoadedModel::tensor(const std::string& name,
                                                 std::vector<int64_t> shape) {
  absl::StatusOr<TensorView> t = files_->get(name);
  if (!t.ok()) return t.status();
  const std::string where = absl::StrCat(files_->path_of(name), ": tensor '", name, "': ");
  if (t->dtype != DType::kF32 && t->dtype != DType::kF16 && t->dtype != DType::kBF16) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, "dtype ", dtype_name(t->dtype), ", expected F32, F16 or BF16"));
  }
  if (t->shape != shape) {
    return absl::InvalidArgumentError(absl::StrCat(where, "shape [", absl::StrJoin(t->shape, ", "),
                                                   "], expected [", absl::StrJoin(shape, ", "),
                                                   "]"));
  }
  used_.insert(name);
  const float* data = nullptr;
  const auto addr = reinterpret_cast<uintptr_t>(t->bytes.data());
  if (t->dtype == DType::kF32 && addr % alignof(float) == 0) {
    data = reinterpret_cast<const float*>(t->bytes.data());  // zero-copy from the mapping
  } else {
    converted_.push_back(to_float32(*t));
    data = converted_.back().data();
  }
  // A NaN or inf weight would fail every request later, looking like the client's fault.
  const std::span<const float> values(data, static_cast<size_t>(t->numel()));
  auto bad = std::find_if(values.begin(), values.end(), [](float x) { return !std::isfinite(x); });
  if (bad != values.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, "non-finite value ", *bad, " at element ", bad - values.begin()));
  }
  return data;
}

absl::Status LoadedModel::matrix(const std::string& name, int rows, int cols, Matrix* out) {
  absl::StatusOr<const float*> p = tensor(name, {rows, cols});
  if (!p.ok()) return p.status();
  *out = Matrix{*p, rows, cols};
  return absl::OkStatus();
}

absl::Status LoadedModel::projection(const std::string& name, int rows, int cols, Matrix* out) {
  absl::StatusOr<TensorView> t = files_->get(name);
  if (t.ok() && t->dtype == DType::kI8) return int8_projection(name, *t, rows, cols, out);
  const bool keep = options_.keep_bf16 && t.ok() && t->dtype == DType::kBF16 &&
                    t->shape == std::vector<int64_t>{rows, cols} &&
                    reinterpret_cast<uintptr_t>(t->bytes.data()) % alignof(uint16_t) == 0;
  if (!keep) return matrix(name, rows, cols, out);
  used_.insert(name);
  const auto* bits = reinterpret_cast<const uint16_t*>(t->bytes.data());
  for (int64_t i = 0; i < t->numel(); ++i) {
    if ((bits[i] & 0x7f80u) == 0x7f80u) {  // all exponent bits: inf or NaN
      return absl::InvalidArgumentError(absl::StrCat(files_->path_of(name), ": tensor '", name,
                                                     "': non-finite value ", bf16_to_float(bits[i]),
                                                     " at element ", i));
    }
  }
  *out = Matrix{nullptr, rows, cols, bits};
  return absl::OkStatus();
}

// `name` as I8 [rows, cols] and `name`.scale as F32 [rows]: row r is the values times scale[r].
absl::Status LoadedModel::int8_projection(const std::string& name, const TensorView& t, int rows,
                                          int cols, Matrix* out) {
  const std::string where = absl::StrCat(files_->path_of(name), ": tensor '", name, "': ");
  if (t.shape != std::vector<int64_t>{rows, cols}) {
    return absl::InvalidArgumentError(absl::StrCat(where, "shape [", absl::StrJoin(t.shape, ", "),
                                                   "], expected [", rows, ", ", cols, "]"));
  }
  absl::StatusOr<const float*> scale = tensor(name + ".scale", {rows});
  if (!scale.ok()) return scale.status();
  used_.insert(name);
  const auto* q = reinterpret_cast<const int8_t*>(t.bytes.data());
  if (options_.keep_int8) {
    *out = Matrix{.rows = rows, .cols = cols, .i8 = q, .scale = *scale};
    return absl::OkStatus();
  }
  std::vector<float>& wide = converted_.emplace_back(static_cast<size_t>(rows) * cols);
  for (size_t i = 0; i < wide.size(); ++i) wide[i] = q[i] * (*scale)[i / cols];
  *out = Matrix{wide.data(), rows, cols};
  return absl::OkStatus();
}

absl::Status LoadedModel::vector(const std::string& name, int n, std::span<const float>* out) {
  absl::StatusOr<const float*> p = tensor(name, {n});
  if (!p.ok()) return p.status();
  *out = std::span<const float>(*p, static_cast<size_t>(n));
  return absl::OkStatus();
}

// FoX Pro's per-layer weights, those its config asks for.
absl::Status LoadedModel::load_pro_options(const LayerNames& n, LayerWeights* w) {
  const ModelConfig& c = config_;
  const int a = c.n_heads * c.head_dim;
  if (c.qk_norm) {
    const int len = c.qk_norm_shared ? c.head_dim : a;
    FPA_RETURN_IF_ERROR(vector(n.q_norm, len, &w->q_norm));
    FPA_RETURN_IF_ERROR(vector(n.k_norm, len, &w->k_norm));
  }
  if (c.output_gate) FPA_RETURN_IF_ERROR(matrix(n.ogate, a, c.d_model, &w->ogate));
  if (c.output_norm) FPA_RETURN_IF_ERROR(vector(n.out_norm, a, &w->out_norm));
  if (c.k_shift) FPA_RETURN_IF_ERROR(matrix(n.k_shift, c.n_heads, c.d_model, &w->k_shift));
  if (c.v_shift) FPA_RETURN_IF_ERROR(matrix(n.v_shift, c.n_heads, c.d_model, &w->v_shift));
  return absl::OkStatus();
}

absl::Status LoadedModel::load_layer(int l, LayerWeights* w) {
  const ModelConfig& c = config_;
  const int a = c.n_heads * c.head_dim;
  const LayerNames n = layer_names(c, l);
  FPA_RETURN_IF_ERROR(vector(n.attn_norm, c.d_model, &w->attn_norm));
  FPA_RETURN_IF_ERROR(projection(n.wq, a, c.d_model, &w->wq));
  FPA_RETURN_IF_ERROR(projection(n.wk, a, c.d_model, &w->wk));
  FPA_RETURN_IF_ERROR(projection(n.wv, a, c.d_model, &w->wv));
  FPA_RETURN_IF_ERROR(projection(n.wo, c.d_model, a, &w->wo));
  w->beta.assign(c.n_heads, c.attention == AttentionKind::kFox ? 1.0f : 0.0f);
  if (c.attention != AttentionKind::kSoftmax) {
    FPA_RETURN_IF_ERROR(matrix(n.field_w, c.n_heads, c.d_model, &w->field_w));
    FPA_RETURN_IF_ERROR(vector(n.field_b, c.n_heads, &w->field_b));
  }
  if (c.free_levels) {
    FPA_RETURN_IF_ERROR(matrix(n.level_w, c.n_heads, c.d_model, &w->level_w));
    FPA_RETURN_IF_ERROR(vector(n.level_b, c.n_heads, &w->level_b));
  }
  if (c.attention == AttentionKind::kFpa) {
    std::span<const float> beta_raw;
    FPA_RETURN_IF_ERROR(vector(n.beta_raw, c.n_heads, &beta_raw));
    for (int h = 0; h < c.n_heads; ++h) w->beta[h] = softplus(beta_raw[h]);
  }
  FPA_RETURN_IF_ERROR(load_pro_options(n, w));
  FPA_RETURN_IF_ERROR(vector(n.mlp_norm, c.d_model, &w->mlp_norm));
  if (n.gate_up.empty()) {
    FPA_RETURN_IF_ERROR(projection(n.w_gate, c.d_ff, c.d_model, &w->w_gate));
    FPA_RETURN_IF_ERROR(projection(n.w_up, c.d_ff, c.d_model, &w->w_up));
  } else {
    Matrix fused;
    FPA_RETURN_IF_ERROR(projection(n.gate_up, 2 * c.d_ff, c.d_model, &fused));
    std::tie(w->w_gate, w->w_up) = split_rows(fused);
  }
  FPA_RETURN_IF_ERROR(projection(n.w_down, c.d_model, c.d_ff, &w->w_down));
  return absl::OkStatus();
}

absl::Status LoadedModel::check_no_extra_tensors() const {
  for (const auto& [name, file] : files_->tensors()) {
    if (!used_.contains(name)) {
      return absl::InvalidArgumentError(
          absl::StrCat(file->path(), ": unexpected tensor '", name, "' for a ",
                       attention_kind_name(config_.attention), " model with this config"));
    }
  }
  return absl::OkStatus();
}

absl::Status LoadedModel::load(const std::string& dir, LoadOptions options) {
  options_ = options;
  const std::string config_path = dir + "/config.json";
  absl::StatusOr<std::string> text = read_text_file(config_path);
  if (!text.ok()) return text.status();
  absl::StatusOr<ModelConfig> config = parse_model_config(*text, config_path);
  if (!config.ok()) return config.status();
  config_ = *std::move(config);
  absl::StatusOr<TensorFiles> files = TensorFiles::open(dir);
  if (!files.ok()) return files.status();
  files_ = *std::move(files);

  const ModelConfig& c = config_;
  const WeightNames names = weight_names(c.layout);
  FPA_RETURN_IF_ERROR(matrix(names.embed, c.vocab_size, c.d_model, &embed_));
  layers_.resize(c.n_layers);
  for (int l = 0; l < c.n_layers; ++l) FPA_RETURN_IF_ERROR(load_layer(l, &layers_[l]));
  FPA_RETURN_IF_ERROR(vector(names.final_norm, c.d_model, &final_norm_));
  if (!c.tie_embeddings) {
    FPA_RETURN_IF_ERROR(projection(names.lm_head, c.vocab_size, c.d_model, &lm_head_));
  }
  FPA_RETURN_IF_ERROR(check_no_extra_tensors());
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = load_tokenizer(dir, c);
  if (!tokenizer.ok()) return tokenizer.status();
  if ((*tokenizer)->vocab_size() > c.vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat(dir, ": the tokenizer has ",
                                                   (*tokenizer)->vocab_size(),
                                                   " tokens, more than vocab_size ", c.vocab_size));
  }
  tokenizer_ = *std::move(tokenizer);
  // The published configs keep PretrainedConfig's bos 1 / eos 2 while their LongCrawl64
  // tokenizer's document separator (<|endoftext|>) is both: the tokenizer's ids are the ones
  // the data used.
  if (c.layout == WeightLayout::kHuggingFace) {
    config_.bos_id = tokenizer_->special().bos.value_or(c.bos_id);
    config_.eos_id = tokenizer_->special().eos.value_or(c.eos_id);
  }
  return absl::OkStatus();
}

// Whether some projection has its `member` pointer set (a format kept as the file stores it).
template <class T>
bool any_projection(const Model& model, T Matrix::*member) {
  if (model.lm_head().*member != nullptr) return true;
  for (const LayerWeights& w : model.layers()) {
    for (const Matrix* m : projections(w)) {
      if (m->*member != nullptr) return true;
    }
  }
  return false;
}

}  // namespace

bool keeps_bf16(const Model& model) { return any_projection(model, &Matrix::bf16); }
bool keeps_int8(const Model& model) { return any_projection(model, &Matrix::i8); }

absl::StatusOr<std::unique_ptr<Model>> Model::load(const std::string& dir, LoadOptions options) {
  auto model = std::make_unique<LoadedModel>();
  FPA_RETURN_IF_ERROR(model->load(dir, options));
  return model;
}

}  // namespace fpa
