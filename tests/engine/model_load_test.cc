// Model::load on good and deliberately broken model directories: every failure is a clear
// error naming the file and the tensor, never a crash.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>

#include "kernels/cpu/formats.h"
#include "model/model.h"
#include "model/safetensors.h"
#include "tests/engine/model_files.h"

namespace fpa {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using testing::ModelFiles;
using testing::TempDir;

std::string load_error(const ModelFiles& files) {
  TempDir dir;
  testing::write_model(dir.path(), files);
  absl::StatusOr<std::unique_ptr<Model>> m = Model::load(dir.path());
  return m.ok() ? "OK" : std::string(m.status().message());
}

TEST(ModelLoad, LoadsEveryKind) {
  for (auto [kind, levels] :
       {std::pair{"fpa", "free"}, {"fpa", "tied"}, {"fox", "tied"}, {"softmax", "tied"}}) {
    TempDir dir;
    testing::write_model(dir.path(), testing::random_model(kind, levels, 1));
    absl::StatusOr<std::unique_ptr<Model>> m = Model::load(dir.path());
    ASSERT_TRUE(m.ok()) << kind << ": " << m.status();
    const ModelConfig& c = (*m)->config();
    EXPECT_EQ(c.n_layers, 2);
    EXPECT_EQ((*m)->layers().size(), 2u);
    EXPECT_EQ((*m)->lm_head().data, (*m)->embed().data);  // tied embeddings
    EXPECT_EQ(c.free_levels, std::string(kind) == "fpa" && std::string(levels) == "free");
    EXPECT_EQ((*m)->layers()[0].level_w.data != nullptr, c.free_levels);
  }
}

TEST(ModelLoad, BetaFollowsTheKind) {
  ModelFiles f = testing::random_model("fpa", "tied", 2);
  f.tensors["layers.0.attn.beta_raw"] = testing::f32_tensor({4}, {0.0f, 1.0f, -30.0f, 25.0f});
  TempDir dir;
  testing::write_model(dir.path(), f);
  auto m = Model::load(dir.path());
  ASSERT_TRUE(m.ok()) << m.status();
  const std::vector<float>& beta = (*m)->layers()[0].beta;
  EXPECT_NEAR(beta[0], std::log(2.0f), 1e-6);
  EXPECT_NEAR(beta[1], std::log1p(std::exp(1.0f)), 1e-6);
  EXPECT_NEAR(beta[2], 0.0f, 1e-12);
  EXPECT_EQ(beta[3], 25.0f);  // linear above 20, as torch's softplus
  for (const char* kind : {"fox", "softmax"}) {
    TempDir d2;
    testing::write_model(d2.path(), testing::random_model(kind, "tied", 3));
    auto m2 = Model::load(d2.path());
    ASSERT_TRUE(m2.ok()) << m2.status();
    EXPECT_EQ((*m2)->layers()[1].beta[0], std::string(kind) == "fox" ? 1.0f : 0.0f);
  }
}

TEST(ModelLoad, MissingTensorIsNamed) {
  ModelFiles f = testing::random_model("fpa", "free", 1);
  f.tensors.erase("layers.1.attn.level_w");
  EXPECT_THAT(load_error(f), AllOf(HasSubstr("model.safetensors"),
                                   HasSubstr("missing tensor 'layers.1.attn.level_w'")));
}

TEST(ModelLoad, WrongShapeIsNamed) {
  ModelFiles f = testing::random_model("fpa", "tied", 1);
  f.tensors["layers.0.mlp.w_up"] = testing::f32_tensor({48, 31}, std::vector<float>(48 * 31));
  EXPECT_THAT(load_error(f), AllOf(HasSubstr("'layers.0.mlp.w_up'"), HasSubstr("[48, 31]"),
                                   HasSubstr("expected [48, 32]")));
}

TEST(ModelLoad, WrongDtypeIsNamed) {
  ModelFiles f = testing::random_model("fox", "tied", 1);
  f.tensors["final_norm.weight"].dtype = "I32";
  EXPECT_THAT(load_error(f), AllOf(HasSubstr("'final_norm.weight'"), HasSubstr("dtype I32")));
  f.tensors["final_norm.weight"].dtype = "Q4";
  EXPECT_THAT(load_error(f), AllOf(HasSubstr("'final_norm.weight'"), HasSubstr("Q4")));
}

TEST(ModelLoad, ExtraTensorIsNamed) {
  ModelFiles f = testing::random_model("softmax", "tied", 1);
  f.tensors["layers.0.attn.beta_raw"] = testing::f32_tensor({4}, {0, 0, 0, 0});
  EXPECT_THAT(load_error(f), HasSubstr("unexpected tensor 'layers.0.attn.beta_raw'"));
}

TEST(ModelLoad, TruncatedDataIsNamed) {
  const ModelFiles f = testing::random_model("fpa", "free", 1);
  TempDir dir;
  testing::write_model(dir.path(), f);
  testing::write_safetensors(dir.path() + "/model.safetensors", f.tensors, /*drop=*/10);
  auto m = Model::load(dir.path());
  ASSERT_FALSE(m.ok());
  // Tensors are laid out by name: the last one is the first to run past the end.
  EXPECT_THAT(std::string(m.status().message()),
              AllOf(HasSubstr("'layers.1.mlp_norm.weight'"), HasSubstr("truncated")));
}

// An 8-byte little-endian length, then `header` (and no data).
std::string with_header(const std::string& header, uint64_t length) {
  return std::string(reinterpret_cast<const char*>(&length), 8) + header;
}
std::string with_header(const std::string& header) { return with_header(header, header.size()); }

TEST(ModelLoad, CorruptHeaderIsAnError) {
  TempDir dir;
  testing::write_model(dir.path(), testing::random_model("fpa", "tied", 1));
  const std::string path = dir.path() + "/model.safetensors";
  const std::pair<std::string, std::string> cases[] = {
      {"abc", "truncated"},
      {with_header("{}", uint64_t{1} << 62), "runs past the end of the file"},
      {with_header("{{{{"), "not a JSON object"},
      {with_header(R"({"a":{"dtype":"F32","shape":[2]}})"), "lacks dtype, shape or data_offsets"},
      {with_header(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})"), "do not match"},
      {with_header(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})"), "negative"},
      {with_header(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                   R"("b":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})") +
           std::string(4, '\0'),
       "overlap another tensor"},
      {with_header(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},)"
                   R"("b":{"dtype":"F32","shape":[1],"data_offsets":[2,6]}})") +
           std::string(6, '\0'),
       "'b': data_offsets begin 2 is not a multiple of the F32 element size"},
      {with_header(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})") +
           std::string(8, '\0'),
       "leave a hole"},
      {with_header(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})") +
           std::string(8, '\0'),
       "the tensors cover 4 of 8 data bytes"},
      {with_header(std::string(17 << 20, ' ')), "over the limit of 16777216 bytes"},
      // Refused before the JSON library builds (and recursively copies) a value of this depth.
      {with_header(R"({"__metadata__":)" + std::string(100000, '[') + std::string(100000, ']') +
                   "}"),
       "nests deeper than 64 levels"},
  };
  for (const auto& [blob, why] : cases) {
    std::ofstream(path, std::ios::binary) << blob;
    auto m = Model::load(dir.path());
    ASSERT_FALSE(m.ok());
    EXPECT_THAT(std::string(m.status().message()), AllOf(HasSubstr(path), HasSubstr(why)));
  }
}

TEST(ModelLoad, BadConfigIsNamed) {
  ModelFiles f = testing::random_model("fpa", "tied", 1);
  f.config["attention"] = "mamba";
  EXPECT_THAT(load_error(f), AllOf(HasSubstr("config.json"), HasSubstr("'mamba'")));
  f = testing::random_model("fpa", "tied", 1);
  f.config["d_model"] = "wide";
  EXPECT_THAT(load_error(f), AllOf(HasSubstr("config.json"), HasSubstr("'d_model'")));
  f.config.erase("d_model");
  EXPECT_THAT(load_error(f), HasSubstr("'d_model' is missing"));

  TempDir dir;
  testing::write_model(dir.path(), testing::random_model("fpa", "tied", 1));
  std::ofstream(dir.path() + "/config.json") << "{\"format\": \"fpa-serve/1\", ";
  auto m = Model::load(dir.path());
  ASSERT_FALSE(m.ok());
  EXPECT_THAT(std::string(m.status().message()), HasSubstr("not a valid JSON object"));
  EXPECT_FALSE(Model::load(dir.path() + "/nope").ok());
}

// Every size is checked against a bound before anything is allocated for it: these configs used
// to allocate gigabytes, overflow int, or load an infinite tau.
TEST(ModelLoad, ConfigOutOfBoundsIsNamed) {
  using nlohmann::json;
  const std::pair<json, std::string> cases[] = {
      {{{"n_layers", 16777216}}, "'n_layers' must be an integer in [1, 1024]"},
      {{{"n_layers", uint64_t{1} << 63}}, "'n_layers' must be an integer"},
      {{{"vocab_size", 1 << 24}}, "'vocab_size' must be an integer in [1, 1048576]"},
      {{{"n_heads", 32}, {"head_dim", 4096}}, "n_heads * head_dim = 131072 is over the limit"},
      {{{"d_model", 8192}, {"d_ff", 1 << 18}}, "d_ff * d_model = 2147483648 is over the limit"},
      {{{"vocab_size", 1 << 20}, {"d_model", 2048}}, "vocab_size * d_model = 2147483648"},
      {{{"tau", 1e300}}, "'tau' must be a number in"},
      {{{"tau", 0}}, "'tau' must be a number in"},
      {{{"norm_eps", -1}}, "'norm_eps' must be a number in"},
      {{{"rope_theta", 1e40}}, "'rope_theta' must be a number in"},
  };
  for (const auto& [patch, why] : cases) {
    ModelFiles f = testing::random_model("fpa", "tied", 1);
    f.config.update(patch);
    EXPECT_THAT(load_error(f), AllOf(HasSubstr("config.json"), HasSubstr(why))) << patch;
  }
}

TEST(ModelLoad, NonFiniteWeightsAreNamed) {
  ModelFiles f = testing::random_model("fpa", "free", 1);
  f.tensors["final_norm.weight"] = testing::f32_tensor({32}, std::vector<float>(32, 1.0f));
  std::memcpy(f.tensors["final_norm.weight"].bytes.data() + 4 * 7, "\x00\x00\x80\x7f", 4);
  EXPECT_THAT(load_error(f), AllOf(HasSubstr("'final_norm.weight'"), HasSubstr("non-finite"),
                                   HasSubstr("element 7")));
  f = testing::random_model("fpa", "free", 1);
  std::vector<float> nan(4 * 32, 0.0f);
  nan[5] = std::nanf("");
  f.tensors["layers.1.attn.level_w"] = testing::f32_tensor({4, 32}, nan);
  EXPECT_THAT(load_error(f), AllOf(HasSubstr("'layers.1.attn.level_w'"), HasSubstr("nan")));
  f = testing::random_model("fpa", "tied", 1);
  const uint16_t f16_inf[4] = {0x3c00, 0x7c00, 0x3c00, 0x3c00};  // converted tensors too
  f.tensors["layers.0.attn.field_b"] = {
      "F16", {4}, std::string(reinterpret_cast<const char*>(f16_inf), 8)};
  EXPECT_THAT(load_error(f), AllOf(HasSubstr("'layers.0.attn.field_b'"), HasSubstr("inf")));
}

// A kept BF16 projection is still checked: an inf in its bits is named like any other.
TEST(ModelLoad, NonFiniteKeptBf16IsNamed) {
  ModelFiles f = testing::random_model("fpa", "free", 1);
  std::vector<uint16_t> bits(64 * 32, 0x3f80);  // wq [4 heads x 16, d_model 32]
  bits[9] = 0xff80;                             // -inf
  f.tensors["layers.0.attn.wq"] = {
      "BF16", {64, 32}, std::string(reinterpret_cast<const char*>(bits.data()), 2 * bits.size())};
  TempDir dir;
  testing::write_model(dir.path(), f);
  auto m = Model::load(dir.path(), {.keep_bf16 = true});
  ASSERT_FALSE(m.ok());
  EXPECT_THAT(
      std::string(m.status().message()),
      AllOf(HasSubstr("'layers.0.attn.wq'"), HasSubstr("non-finite"), HasSubstr("element 9")));
}

// An I8 projection with its per-row `.scale` (train/quantize_int8.py): widened to float32 at
// load, or kept as stored (LoadOptions::keep_int8) for the CPU backend's int8 weights. The
// field's projections are float only: eviction decisions hang on them.
TEST(ModelLoad, Int8ProjectionsWidenOrStayAsStored) {
  ModelFiles f = testing::random_model("fpa", "free", 1);
  std::vector<int8_t> q(64 * 32);  // wq [4 heads x 16, d_model 32]
  for (size_t i = 0; i < q.size(); ++i) q[i] = static_cast<int8_t>(static_cast<int>(i % 255) - 127);
  std::vector<float> scale(64);
  for (int r = 0; r < 64; ++r) scale[r] = 0.01f * static_cast<float>(r + 1);
  f.tensors["layers.0.attn.wq"] = {"I8", {64, 32}, std::string(q.begin(), q.end())};
  f.tensors["layers.0.attn.wq.scale"] = testing::f32_tensor({64}, scale);
  TempDir dir;
  testing::write_model(dir.path(), f);
  auto wide = Model::load(dir.path());
  ASSERT_TRUE(wide.ok()) << wide.status();
  EXPECT_EQ((*wide)->layers()[0].wq.data[33], q[33] * scale[1]);
  EXPECT_FALSE(keeps_int8(**wide));
  auto kept = Model::load(dir.path(), {.keep_int8 = true});
  ASSERT_TRUE(kept.ok()) << kept.status();
  const Matrix& wq = (*kept)->layers()[0].wq;
  EXPECT_EQ(wq.data, nullptr);
  ASSERT_NE(wq.i8, nullptr);
  EXPECT_EQ(wq.i8[33], q[33]);
  EXPECT_EQ(wq.scale[1], scale[1]);
  EXPECT_NE((*kept)->layers()[0].field_w.data, nullptr);
  EXPECT_TRUE(keeps_int8(**kept));

  ModelFiles no_scale = f;
  no_scale.tensors.erase("layers.0.attn.wq.scale");
  EXPECT_THAT(load_error(no_scale), HasSubstr("'layers.0.attn.wq.scale'"));
  ModelFiles field = f;
  field.tensors["layers.0.attn.field_w"] = {"I8", {4, 32}, std::string(128, '\1')};
  field.tensors["layers.0.attn.field_w.scale"] = testing::f32_tensor({4}, {1, 1, 1, 1});
  EXPECT_THAT(load_error(field),
              AllOf(HasSubstr("'layers.0.attn.field_w'"), HasSubstr("dtype I8")));
}

// config.json's formats_within_bounds is what --cpu-weights / --kv-dtype auto may pick, stepped
// down to what the CPU runs; explicit choices pass through; nothing measured is float32.
TEST(ModelLoad, AutoFormatsFollowTheMeasuredBoundsAndTheCpu) {
  ModelFiles f = testing::random_model("fpa", "free", 1);
  f.config["formats_within_bounds"] = {{"weights", "int8"}, {"kv", "bf16"}};
  TempDir dir;
  testing::write_model(dir.path(), f);
  auto m = Model::load(dir.path());
  ASSERT_TRUE(m.ok()) << m.status();
  const ModelConfig& c = (*m)->config();
  auto pick = [&](CpuFeatures cpu, const char* weights = "auto") {
    const CpuFormats p = resolve_cpu_formats(weights, "auto", c, cpu);
    return p.weights + "/" + p.kv;
  };
  EXPECT_EQ(pick({.bf16 = true, .vnni = true}), "int8/bf16");
  EXPECT_EQ(pick({.bf16 = true, .vnni = false}), "bf16/bf16");
  EXPECT_EQ(pick({.bf16 = false, .vnni = false}), "f32/bf16");
  EXPECT_EQ(pick({.bf16 = true, .vnni = true}, "f32"), "f32/bf16");
  EXPECT_EQ(resolve_cpu_formats("auto", "auto", ModelConfig{}, {true, true}).weights, "f32");
  EXPECT_EQ(resolve_cpu_formats("auto", "auto", ModelConfig{}, {true, true}).kv, "f32");

  f.config["formats_within_bounds"] = {{"weights", "int4"}};
  EXPECT_THAT(load_error(f), AllOf(HasSubstr("formats_within_bounds"), HasSubstr("weights")));
}

TEST(ModelLoad, HalfPrecisionIsConverted) {
  ModelFiles f = testing::random_model("fpa", "tied", 1);
  // 1.0, -2.0, 0.5 and a subnormal (2^-24) as F16; 1.0, -3.0 as BF16 (padded to 4 values).
  const uint16_t f16[4] = {0x3c00, 0xc000, 0x3800, 0x0001};
  f.tensors["layers.0.attn.field_b"] = {
      "F16", {4}, std::string(reinterpret_cast<const char*>(f16), 8)};
  const uint16_t bf16[4] = {0x3f80, 0xc040, 0x0000, 0x3f80};
  f.tensors["layers.0.attn.beta_raw"] = {
      "BF16", {4}, std::string(reinterpret_cast<const char*>(bf16), 8)};
  TempDir dir;
  testing::write_model(dir.path(), f);
  auto m = Model::load(dir.path());
  ASSERT_TRUE(m.ok()) << m.status();
  std::span<const float> b = (*m)->layers()[0].field_b;
  EXPECT_EQ(b[0], 1.0f);
  EXPECT_EQ(b[1], -2.0f);
  EXPECT_EQ(b[2], 0.5f);
  EXPECT_EQ(b[3], std::ldexp(1.0f, -24));
  EXPECT_NEAR((*m)->layers()[0].beta[1], std::log1p(std::exp(-3.0f)), 1e-6);
}

}  // namespace
}  // namespace fpa
