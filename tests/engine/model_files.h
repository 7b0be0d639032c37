// Test helper: writes model directories (config.json + model.safetensors) with random weights,
// and lets a test break them on purpose.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"

namespace fpa::testing {

struct Tensor {
  std::string dtype = "F32";
  std::vector<int64_t> shape;
  std::string bytes;  // raw little-endian data
};
using TensorMap = std::map<std::string, Tensor>;

Tensor f32_tensor(std::vector<int64_t> shape, const std::vector<float>& values);

// Writes a safetensors file; the last `drop_tail_bytes` bytes are cut off (a truncated file).
void write_safetensors(const std::string& path, const TensorMap& tensors,
                       size_t drop_tail_bytes = 0);

struct ModelFiles {
  nlohmann::json config;
  TensorMap tensors;
};

struct Dims {
  int d_model = 32;
  int n_layers = 2;
  int n_heads = 4;
  int head_dim = 16;
  int d_ff = 48;
};

// kind: fpa | fox | softmax; levels: free | tied. Weights ~ N(0, 1/fan_in), seeded.
ModelFiles random_model(const std::string& kind, const std::string& levels, uint32_t seed,
                        Dims dims = {});
void write_model(const std::string& dir, const ModelFiles& files);

// GPT-2's byte-level spelling of one byte (bytes_to_unicode), written out independently of
// model/byte_level.cc: the text vocab.json and merges.txt use for it.
std::string spell(unsigned char b);

// A fresh empty directory under the system temp dir, removed with everything in it at scope end.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace fpa::testing
