// A loaded model: config.json parsed and model.safetensors memory-mapped and validated
// (docs/model-format.md). Weights are float32 views (converted copies when stored as F16/BF16).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "model/tokenizer.h"

namespace fpa {

enum class AttentionKind { kFpa, kFox, kSoftmax };

// Where the weights are and what they are called (docs/model-format.md).
enum class WeightLayout {
  kFpaServe,     // fpa-serve/1: layers.L.attn.wq, ...
  kHuggingFace,  // the Forgetting Transformer family: model.layers.L.attn.q_proj.weight, ...
};

struct ModelConfig {
  int vocab_size = 0;
  int d_model = 0;
  int n_layers = 0;
  int n_heads = 0;
  int head_dim = 0;
  int d_ff = 0;
  AttentionKind attention = AttentionKind::kFpa;
  bool free_levels = false;  // fpa only
  float rope_theta = 0.0f;   // softmax only; 0 = none
  float norm_eps = 1e-5f;
  bool tie_embeddings = false;
  int train_len = 0;
  float tau = 20.0f;
  int bos_id = 256;
  int eos_id = 257;
  int pad_id = 258;
  WeightLayout layout = WeightLayout::kFpaServe;
  // FoX Pro's options (Hugging Face format; docs/model-format.md).
  bool qk_norm = false;           // q and k RMS-normed per head (eps 1e-5), before attention
  bool qk_norm_shared = false;    // ... with one [head_dim] scale for every head
  bool output_norm = false;       // the attention output RMS-normed per head (norm_eps)
  bool output_gate = false;       // ... then times act(ogate x), before wo
  bool output_gate_silu = false;  // act = silu (else sigmoid)
  // Key / value shift (ShiftLinear): row t of k (v) becomes a_t k'_{t-1} + (1 - a_t) k'_t per
  // head, a = sigmoid(shift x), k' the projection; k'_{-1} = 0. The backend carries each
  // sequence's last k' (v') row from one forward to the next.
  bool k_shift = false, v_shift = false;
  // The most compact CPU weight and KV formats ("f32", "bf16", "int8"; "f32", "bf16") whose
  // accuracy loss on this model was measured within issue 26's bounds (config.json
  // "formats_within_bounds"; docs/model-format.md): what --cpu-weights / --kv-dtype auto may
  // pick. float32 where nothing was measured.
  std::string compact_weights = "f32", compact_kv = "f32";
  std::string raw_json;  // the whole config.json, for ModelInfo
};

// A row-major matrix [rows, cols] (PyTorch Linear layout [out, in]): float32, or, for a
// projection the file stores as BF16 (I8) and the loader was asked to keep (LoadOptions), the
// file's bf16 bits (int8 values and per-row scales) with no float32 copy (data null).
struct Matrix {
  const float* data = nullptr;
  int rows = 0;
  int cols = 0;
  const uint16_t* bf16 = nullptr;
  const int8_t* i8 = nullptr;    // row r is i8[r * cols, ...) times scale[r]
  const float* scale = nullptr;  // [rows]
};

struct LoadOptions {
  // The projections (attention, MLP, an untied lm_head) stored as BF16 stay as stored, mapped
  // from the file, for a backend that reads bf16 weights (the CPU backend with bf16 weights).
  // The embedding, norms and the field's projections are float32 whatever the file holds.
  bool keep_bf16 = false;
  // The projections stored as I8 with per-row scales (docs/model-format.md) stay as stored, for
  // the CPU backend with int8 weights; otherwise they are widened to float32 at load.
  bool keep_int8 = false;
};

struct LayerWeights {
  std::span<const float> attn_norm;  // [d_model]
  Matrix wq, wk, wv;                 // [A, d_model]
  Matrix wo;                         // [d_model, A]
  Matrix field_w;                    // [H, d_model] (fpa, fox; else empty)
  std::span<const float> field_b;    // [H]
  Matrix level_w;                    // [H, d_model] (free levels; else empty)
  std::span<const float> level_b;    // [H]
  std::vector<float> beta;           // [H]: softplus(beta_raw) for fpa, 1 for fox, 0 for softmax
  std::span<const float> q_norm, k_norm;  // [A], or [head_dim] when shared (qk_norm)
  Matrix ogate;                           // [A, d_model] (output_gate)
  Matrix k_shift, v_shift;                // [H, d_model] (k_shift, v_shift)
  std::span<const float> out_norm;        // [A] (output_norm)
  std::span<const float> mlp_norm;        // [d_model]
  Matrix w_gate, w_up;                    // [d_ff, d_model]
  Matrix w_down;                          // [d_model, d_ff]
};

// A layer's projections: the matrices bf16 weights apply to (the field's stay float32).
inline std::array<const Matrix*, 7> projections(const LayerWeights& w) {
  return {&w.wq, &w.wk, &w.wv, &w.wo, &w.w_gate, &w.w_up, &w.w_down};
}

class Model {
 public:
  // Loads `dir`/config.json, `dir`/model.safetensors and the tokenizer files. Every problem is an
  // error whose message names the file and, for tensors, the tensor.
  static absl::StatusOr<std::unique_ptr<Model>> load(const std::string& dir,
                                                     LoadOptions options = {});
  virtual ~Model() = default;

  virtual const ModelConfig& config() const = 0;
  virtual const Matrix& embed() const = 0;  // [vocab, d_model]
  virtual const std::vector<LayerWeights>& layers() const = 0;
  virtual std::span<const float> final_norm() const = 0;
  virtual const Matrix& lm_head() const = 0;  // embed() when tied

  // The tokenizer of the model's directory (load_tokenizer), or of its byte vocabulary.
  const Tokenizer& tokenizer() const { return *tokenizer_; }

 protected:
  std::unique_ptr<Tokenizer> tokenizer_;
};

// Whether some projection was kept as the file's bf16 bits (LoadOptions::keep_bf16), or int8
// values (keep_int8): only a backend reading that format can run such a model.
bool keeps_bf16(const Model& model);
bool keeps_int8(const Model& model);

}  // namespace fpa
