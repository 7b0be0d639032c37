#include "tests/engine/model_files.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

namespace fpa::testing {

Tensor f32_tensor(std::vector<int64_t> shape, const std::vector<float>& values) {
  Tensor t{"F32", std::move(shape), std::string(values.size() * 4, '\0')};
  std::memcpy(t.bytes.data(), values.data(), t.bytes.size());
  return t;
}

void write_safetensors(const std::string& path, const TensorMap& tensors, size_t drop_tail_bytes) {
  nlohmann::json header = nlohmann::json::object();
  std::string data;
  for (const auto& [name, t] : tensors) {
    header[name] = {{"dtype", t.dtype},
                    {"shape", t.shape},
                    {"data_offsets", {data.size(), data.size() + t.bytes.size()}}};
    data += t.bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  const uint64_t len = text.size();
  std::string blob(reinterpret_cast<const char*>(&len), 8);
  blob += text + data;
  blob.resize(blob.size() - std::min(drop_tail_bytes, blob.size()));
  std::ofstream(path, std::ios::binary) << blob;
}

ModelFiles random_model(const std::string& kind, const std::string& levels, uint32_t seed,
                        Dims dims) {
  const int vocab = 259, d = dims.d_model, h = dims.n_heads, a = h * dims.head_dim;
  ModelFiles m;
  m.config = {{"format", "fpa-serve/1"},
              {"vocab_size", vocab},
              {"d_model", d},
              {"n_layers", dims.n_layers},
              {"n_heads", h},
              {"head_dim", dims.head_dim},
              {"d_ff", dims.d_ff},
              {"attention", kind},
              {"levels", levels},
              {"rope_theta", kind == "softmax" ? 10000.0 : 0.0},
              {"norm_eps", 1e-5},
              {"tie_embeddings", true},
              {"train_len", 64},
              {"tau", 4.0},
              {"tokenizer", {{"type", "byte"}, {"bos_id", 256}, {"eos_id", 257}, {"pad_id", 258}}}};
  std::mt19937 rng(seed);
  auto normal = [&](std::vector<int64_t> shape, float std, float mean = 0.0f) {
    std::normal_distribution<float> dist(mean, std);
    size_t n = 1;
    for (int64_t s : shape) n *= s;
    std::vector<float> v(n);
    for (float& x : v) x = dist(rng);
    return f32_tensor(std::move(shape), v);
  };
  auto ones = [](int n) { return f32_tensor({n}, std::vector<float>(n, 1.0f)); };
  auto lin = [&](int out, int in) { return normal({out, in}, 1.0f / std::sqrt(float(in))); };
  m.tensors["embed.weight"] = normal({vocab, d}, 1.0f);
  m.tensors["final_norm.weight"] = ones(d);
  for (int l = 0; l < dims.n_layers; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    m.tensors[p + "attn_norm.weight"] = ones(d);
    m.tensors[p + "mlp_norm.weight"] = ones(d);
    for (const char* w : {"attn.wq", "attn.wk", "attn.wv"}) m.tensors[p + w] = lin(a, d);
    m.tensors[p + "attn.wo"] = lin(d, a);
    m.tensors[p + "mlp.w_gate"] = lin(dims.d_ff, d);
    m.tensors[p + "mlp.w_up"] = lin(dims.d_ff, d);
    m.tensors[p + "mlp.w_down"] = lin(d, dims.d_ff);
    if (kind == "softmax") continue;
    m.tensors[p + "attn.field_w"] = lin(h, d);
    m.tensors[p + "attn.field_b"] = normal({h}, 0.3f, kind == "fox" ? 2.0f : -0.3f);
    if (kind != "fpa") continue;
    m.tensors[p + "attn.beta_raw"] = normal({h}, 0.5f);
    if (levels == "free") {
      m.tensors[p + "attn.level_w"] = lin(h, d);
      m.tensors[p + "attn.level_b"] = normal({h}, 0.1f);
    }
  }
  return m;
}

void write_model(const std::string& dir, const ModelFiles& files) {
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/config.json") << files.config.dump(2);
  write_safetensors(dir + "/model.safetensors", files.tensors);
}

TempDir::TempDir() {
  std::string tmpl = (std::filesystem::temp_directory_path() / "fpa-engine-XXXXXX").string();
  const char* made = ::mkdtemp(tmpl.data());
  path_ = made != nullptr ? made : "/nonexistent-temp-dir";
}

TempDir::~TempDir() { std::filesystem::remove_all(path_); }

std::string spell(unsigned char b) {
  static const std::vector<int> code_points = [] {
    std::vector<int> printable, rest;
    for (int c = 0; c < 256; ++c) {
      bool p = (c >= 33 && c <= 126) || (c >= 161 && c <= 172) || (c >= 174 && c <= 255);
      (p ? printable : rest).push_back(c);
    }
    std::vector<int> cp(256);
    for (int c : printable) cp[c] = c;
    for (size_t i = 0; i < rest.size(); ++i) cp[rest[i]] = 256 + static_cast<int>(i);
    return cp;
  }();
  const int c = code_points[b];
  std::string s;
  if (c < 0x80) {
    s.push_back(static_cast<char>(c));
  } else {
    s.push_back(static_cast<char>(0xC0 | (c >> 6)));
    s.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
  return s;
}

}  // namespace fpa::testing
