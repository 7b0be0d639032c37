// The Hugging Face format of the Forgetting Transformer family (model/hf_config.cc,
// model/weight_names.cc, model/tensor_files.cc): a directory written with the published names
// (fused gate_proj, fgate_proj, model.* prefixes; sharded or not) loads exactly the weights of the
// same model in fpa-serve/1 format, and what the server does not implement is refused by name.
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "model/config.h"
#include "model/model.h"
#include "nlohmann/json.hpp"
#include "tests/engine/model_files.h"

namespace fpa {
namespace {

using ::fpa::testing::ModelFiles;
using ::fpa::testing::TempDir;
using ::fpa::testing::TensorMap;
using nlohmann::json;

constexpr int kLayers = 2;
// The published models' attention width is hidden_size: head_dim = hidden_size / num_heads.
const ::fpa::testing::Dims kDims{
    .d_model = 32, .n_layers = kLayers, .n_heads = 4, .head_dim = 8, .d_ff = 48};

// The published names for an fpa-serve/1 model (fox: FoX LLaMA; softmax: the Transformer).
ModelFiles to_hf(const ModelFiles& ours, bool fox) {
  ModelFiles hf;
  const json& c = ours.config;
  hf.config = {
      {"model_type", fox ? "forgetting_transformer-project_fox" : "transformer-project_fox"},
      {"architectures", {fox ? "ForgettingTransformerForCausalLM" : "TransformerForCausalLM"}},
      {"vocab_size", c["vocab_size"]},
      {"hidden_size", c["d_model"]},
      {"num_hidden_layers", c["n_layers"]},
      {"num_heads", c["n_heads"]},
      {"intermediate_size", c["d_ff"]},
      {"norm_eps", c["norm_eps"]},
      {"tie_word_embeddings", c["tie_embeddings"]},
      {"bos_token_id", 256},
      {"eos_token_id", 257},
      {"torch_dtype", "float32"}};
  if (!fox) hf.config["rope_base"] = c["rope_theta"];
  const TensorMap& t = ours.tensors;
  hf.tensors["model.embeddings.weight"] = t.at("embed.weight");
  hf.tensors["model.norm.weight"] = t.at("final_norm.weight");
  for (int l = 0; l < kLayers; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    const std::string q = "model.layers." + std::to_string(l) + ".";
    hf.tensors[q + "attn_norm.weight"] = t.at(p + "attn_norm.weight");
    hf.tensors[q + "mlp_norm.weight"] = t.at(p + "mlp_norm.weight");
    for (auto [ours_name, hf_name] :
         {std::pair{"wq", "q_proj"}, {"wk", "k_proj"}, {"wv", "v_proj"}, {"wo", "o_proj"}}) {
      hf.tensors[q + "attn." + hf_name + ".weight"] = t.at(p + "attn." + ours_name);
    }
    if (fox) {
      hf.tensors[q + "attn.fgate_proj.weight"] = t.at(p + "attn.field_w");
      hf.tensors[q + "attn.fgate_proj.bias"] = t.at(p + "attn.field_b");
    }
    ::fpa::testing::Tensor fused = t.at(p + "mlp.w_gate");  // gate rows, then up rows
    fused.shape[0] *= 2;
    fused.bytes += t.at(p + "mlp.w_up").bytes;
    hf.tensors[q + "mlp.gate_proj.weight"] = fused;
    hf.tensors[q + "mlp.down_proj.weight"] = t.at(p + "mlp.w_down");
  }
  return hf;
}

void expect_same(const Matrix& a, const Matrix& b, const std::string& what) {
  ASSERT_EQ(a.rows, b.rows) << what;
  ASSERT_EQ(a.cols, b.cols) << what;
  for (int64_t i = 0; i < int64_t{a.rows} * a.cols; ++i) {
    ASSERT_EQ(a.data[i], b.data[i]) << what << " element " << i;
  }
}

void expect_same_model(const Model& a, const Model& b) {
  expect_same(a.embed(), b.embed(), "embed");
  expect_same(a.lm_head(), b.lm_head(), "lm_head");
  ASSERT_EQ(a.layers().size(), b.layers().size());
  for (size_t l = 0; l < a.layers().size(); ++l) {
    const LayerWeights &x = a.layers()[l], &y = b.layers()[l];
    const auto px = projections(x), py = projections(y);
    for (size_t i = 0; i < px.size(); ++i) {
      expect_same(*px[i], *py[i],
                  "layer " + std::to_string(l) + " projection " + std::to_string(i));
    }
    expect_same(x.field_w, y.field_w, "field_w");
    EXPECT_EQ(x.beta, y.beta);
  }
  EXPECT_EQ(a.config().attention, b.config().attention);
  EXPECT_EQ(a.config().rope_theta, b.config().rope_theta);
}

class HfFormat : public ::testing::TestWithParam<const char*> {};

TEST_P(HfFormat, LoadsTheWeightsOfTheSameModelInFpaServeFormat) {
  const bool fox = std::string(GetParam()) == "fox";
  const ModelFiles ours = ::fpa::testing::random_model(GetParam(), "tied", 7, kDims);
  TempDir a, b;
  ::fpa::testing::write_model(a.path(), ours);
  ::fpa::testing::write_model(b.path(), to_hf(ours, fox));
  auto m1 = Model::load(a.path());
  auto m2 = Model::load(b.path());
  ASSERT_TRUE(m1.ok()) << m1.status();
  ASSERT_TRUE(m2.ok()) << m2.status();
  EXPECT_EQ((*m2)->config().layout, WeightLayout::kHuggingFace);
  expect_same_model(**m1, **m2);
}

// The fused gate_proj stored as I8 (train/quantize_int8.py): kept as stored, its halves are the
// gate and up projections with their own rows of scales; widened, the same values in float32.
TEST(HfFormat, FusedInt8GateProjSplitsWithItsScales) {
  ModelFiles hf = to_hf(::fpa::testing::random_model("fox", "tied", 7, kDims), true);
  const int rows = 2 * kDims.d_ff, cols = kDims.d_model;
  std::string q(static_cast<size_t>(rows) * cols, '\0');
  std::vector<float> scale(rows);
  for (int r = 0; r < rows; ++r) {
    scale[r] = 0.01f * static_cast<float>(r + 1);
    for (int c = 0; c < cols; ++c) q[r * cols + c] = static_cast<char>((r * 7 + c) % 255 - 127);
  }
  hf.tensors["model.layers.1.mlp.gate_proj.weight"] = {"I8", {rows, cols}, q};
  hf.tensors["model.layers.1.mlp.gate_proj.weight.scale"] =
      ::fpa::testing::f32_tensor({rows}, scale);
  TempDir dir;
  ::fpa::testing::write_model(dir.path(), hf);
  auto kept = Model::load(dir.path(), {.keep_int8 = true});
  auto wide = Model::load(dir.path());
  ASSERT_TRUE(kept.ok()) << kept.status();
  ASSERT_TRUE(wide.ok()) << wide.status();
  const LayerWeights& k = (*kept)->layers()[1];
  const int up = kDims.d_ff * cols + 5;  // element 5 of the up half's first row
  EXPECT_EQ(k.w_up.rows, kDims.d_ff);
  EXPECT_EQ(k.w_up.i8[5], static_cast<int8_t>(q[up]));
  EXPECT_EQ(k.w_up.scale[0], scale[kDims.d_ff]);
  EXPECT_EQ(k.w_gate.scale[0], scale[0]);
  EXPECT_EQ((*wide)->layers()[1].w_up.data[5], static_cast<int8_t>(q[up]) * scale[kDims.d_ff]);
}

TEST_P(HfFormat, ShardedCheckpointsLoadThroughTheIndex) {
  const bool fox = std::string(GetParam()) == "fox";
  const ModelFiles ours = ::fpa::testing::random_model(GetParam(), "tied", 8, kDims);
  const ModelFiles hf = to_hf(ours, fox);
  TempDir a, b;
  ::fpa::testing::write_model(a.path(), ours);
  TensorMap first, second;
  json map = json::object();
  for (const auto& [name, t] : hf.tensors) {
    const bool late = name.find("layers.1.") != std::string::npos || name == "model.norm.weight";
    (late ? second : first)[name] = t;
    map[name] = late ? "model-00002-of-00002.safetensors" : "model-00001-of-00002.safetensors";
  }
  ::fpa::testing::write_safetensors(b.path() + "/model-00001-of-00002.safetensors", first);
  ::fpa::testing::write_safetensors(b.path() + "/model-00002-of-00002.safetensors", second);
  std::ofstream(b.path() + "/model.safetensors.index.json") << json{{"weight_map", map}}.dump();
  std::ofstream(b.path() + "/config.json") << hf.config.dump();
  auto m1 = Model::load(a.path());
  auto m2 = Model::load(b.path());
  ASSERT_TRUE(m1.ok()) << m1.status();
  ASSERT_TRUE(m2.ok()) << m2.status();
  expect_same_model(**m1, **m2);
}

INSTANTIATE_TEST_SUITE_P(FoxAndTransformer, HfFormat, ::testing::Values("fox", "softmax"));

// parse_hf_config's answer for `changes` applied to a small FoX config.
absl::StatusOr<ModelConfig> parse(const json& changes) {
  json c = {{"model_type", "forgetting_transformer-project_fox"},
            {"vocab_size", 300},
            {"hidden_size", 64},
            {"num_hidden_layers", 2},
            {"num_heads", 4}};
  for (const auto& [k, v] : changes.items()) c[k] = v;
  return parse_hf_config(c, c.dump(), "config.json");
}

TEST(HfConfig, UnimplementedOptionsAreRefusedNamingTheKey) {
  for (const char* key : {"use_rope"}) {
    auto c = parse({{key, true}});
    ASSERT_FALSE(c.ok()) << key;
    EXPECT_NE(c.status().message().find(std::string("'") + key + "'"), std::string::npos)
        << c.status();
  }
  for (auto [key, value] : {std::pair<const char*, json>{"num_kv_heads", 2},
                            {"fgate_type", "bias_only"},
                            {"hidden_act", "sigmoid"},
                            {"window_size", 128},
                            {"some_new_option", 1},
                            {"ogate_act", "relu"}}) {
    auto c = parse({{key, value}});
    ASSERT_FALSE(c.ok()) << key;
    EXPECT_NE(c.status().message().find(std::string("'") + key + "'"), std::string::npos)
        << c.status();
  }
}

TEST(HfConfig, FoxProOptionsBesidesTheShiftAreRead) {
  auto c = parse({{"qk_norm", true}, {"use_output_gate", true}, {"use_output_norm", true}});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->qk_norm && c->output_gate && c->output_norm);
  EXPECT_FALSE(c->qk_norm_shared || c->output_gate_silu);
  // The published code asserts a sigmoid gate on a normed output.
  c = parse({{"use_output_gate", true}, {"use_output_norm", true}, {"ogate_act", "silu"}});
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("'ogate_act'"), std::string::npos) << c.status();
}

TEST(HfConfig, PublishedDefaultsAndTheMlpWidthRule) {
  auto c = parse(json::object());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->head_dim, 16);
  EXPECT_EQ(c->d_ff, 256);  // int(64 * 4 * 2 / 3) = 170, rounded up to a multiple of 256
  EXPECT_FLOAT_EQ(c->norm_eps, 1e-6f);
  EXPECT_FALSE(c->tie_embeddings);
  EXPECT_EQ(c->attention, AttentionKind::kFox);
  // FoX Pro 760M's width: hidden 1536, hidden_ratio 3.5 -> 3584.
  c = parse({{"hidden_size", 1536}, {"num_heads", 24}, {"hidden_ratio", 3.5}});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->d_ff, 3584);
  // Weights stored in bfloat16 are a compact format --cpu-weights auto may pick; float32 not.
  EXPECT_EQ(c->compact_weights, "f32");
  c = parse({{"torch_dtype", "bfloat16"}});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->compact_weights, "bf16");
  EXPECT_EQ(c->compact_kv, "f32");
  // The Transformer baseline: RoPE at rope_base 500000 unless use_rope is false.
  c = parse({{"model_type", "transformer-project_fox"}});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->attention, AttentionKind::kSoftmax);
  EXPECT_FLOAT_EQ(c->rope_theta, 500000.0f);
}

TEST(HfFormat, TheTokenizersBosAndEosWinOverThePublishedConfigDefaults) {
  TempDir d;
  ModelFiles hf = to_hf(::fpa::testing::random_model("fox", "tied", 10, kDims), true);
  hf.config.erase("bos_token_id");  // as the published configs: PretrainedConfig's 1 and 2
  hf.config.erase("eos_token_id");
  ::fpa::testing::write_model(d.path(), hf);
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[::fpa::testing::spell(static_cast<unsigned char>(b))] = b;
  vocab["<|endoftext|>"] = 258;
  std::ofstream(d.path() + "/vocab.json") << vocab.dump();
  std::ofstream(d.path() + "/merges.txt") << "#version: 0.2\n";
  std::ofstream(d.path() + "/tokenizer_config.json")
      << json{{"tokenizer_class", "JSONGPT2Tokenizer"}, {"add_bos_token", true}}.dump();
  auto m = Model::load(d.path());
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ((*m)->config().bos_id, 258);  // GPT2Tokenizer's default: <|endoftext|>
  EXPECT_EQ((*m)->config().eos_id, 258);
  EXPECT_EQ((*m)->tokenizer().kind(), "bpe-json");
  EXPECT_EQ((*m)->tokenizer().encode("a")[0], 258);
}

TEST(HfFormat, PytorchBinIsRefusedWithTheWayToConvertIt) {
  TempDir d;
  const ModelFiles hf = to_hf(::fpa::testing::random_model("fox", "tied", 9, kDims), true);
  std::ofstream(d.path() + "/config.json") << hf.config.dump();
  std::ofstream(d.path() + "/pytorch_model.bin") << "not read";
  auto m = Model::load(d.path());
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("train/convert_bin.py"), std::string::npos) << m.status();
}

}  // namespace
}  // namespace fpa
