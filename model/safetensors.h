// A memory-mapped safetensors file (https://github.com/huggingface/safetensors): an 8-byte
// little-endian header length, a JSON header, then raw little-endian tensor data. Opening
// validates the whole header, so every tensor handed out lies inside the file.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace fpa {

enum class DType { kF32, kF16, kBF16, kI32, kI64, kU8, kI8 };

// "F32" -> kF32 etc.; InvalidArgument for dtypes this project does not use.
absl::StatusOr<DType> parse_dtype(const std::string& name);
size_t dtype_size(DType dtype);
const char* dtype_name(DType dtype);

struct TensorView {
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  std::span<const std::byte> bytes;
  int64_t numel() const;
};

class SafetensorsFile {
 public:
  // Maps `path` read-only. Errors name the file and, where one is at fault, the tensor.
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> open(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::map<std::string, TensorView>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // NotFound naming the file and the tensor.
  absl::StatusOr<TensorView> get(const std::string& name) const;

 private:
  SafetensorsFile() = default;
  absl::Status parse_header();

  std::string path_;
  const std::byte* base_ = nullptr;
  size_t size_ = 0;
  std::map<std::string, TensorView> tensors_;
  std::map<std::string, std::string> metadata_;
};

// Float32 copy of a F32, F16 or BF16 tensor (safetensors data need not be 4-byte aligned).
std::vector<float> to_float32(const TensorView& t);

}  // namespace fpa
