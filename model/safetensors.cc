#include "model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <limits>
#include <tuple>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "model/bf16.h"
#include "model/json_depth.h"
#include "nlohmann/json.hpp"

namespace fpa {
namespace {

// A header larger than this is certainly corrupt (ours are a few kilobytes; the largest config
// the loader accepts needs about 2 MB). It bounds the parsed JSON's memory to a few hundred MB.
constexpr uint64_t kMaxHeaderBytes = 16u << 20;

float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);  // inf / nan
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;
  } else {  // subnormal: renormalise
    exp = 113;
    while ((mant & 0x400u) == 0) {
      mant <<= 1;
      --exp;
    }
    bits = sign | (exp << 23) | ((mant & 0x3ffu) << 13);
  }
  return std::bit_cast<float>(bits);
}

absl::StatusOr<std::vector<int64_t>> parse_shape(const nlohmann::json& j) {
  if (!j.is_array()) return absl::InvalidArgumentError("shape is not an array");
  std::vector<int64_t> shape;
  for (const auto& d : j) {
    if (!d.is_number_integer() || d.get<int64_t>() < 0) {
      return absl::InvalidArgumentError("shape has a non-integer or negative dimension");
    }
    shape.push_back(d.get<int64_t>());
  }
  return shape;
}

// Where one tensor's data lies, relative to the start of the data section.
struct Extent {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;
};

// One header entry: its dtype, shape and data_offsets, checked against each other and the file.
absl::StatusOr<Extent> parse_entry(const std::string& path, const std::string& name,
                                   const nlohmann::json& entry, uint64_t data_size) {
  const std::string where = absl::StrCat(path, ": tensor '", name, "': ");
  if (!entry.is_object() || !entry.contains("dtype") || !entry.contains("shape") ||
      !entry.contains("data_offsets") || !entry["dtype"].is_string()) {
    return absl::DataLossError(where + "header entry lacks dtype, shape or data_offsets");
  }
  absl::StatusOr<DType> dtype = parse_dtype(entry["dtype"].get<std::string>());
  if (!dtype.ok()) return absl::InvalidArgumentError(where + std::string(dtype.status().message()));
  absl::StatusOr<std::vector<int64_t>> shape = parse_shape(entry["shape"]);
  if (!shape.ok()) return absl::DataLossError(where + std::string(shape.status().message()));
  const auto& offs = entry["data_offsets"];
  if (!offs.is_array() || offs.size() != 2 || !offs[0].is_number_unsigned() ||
      !offs[1].is_number_unsigned()) {
    return absl::DataLossError(where + "data_offsets is not [begin, end]");
  }
  Extent e{name, *dtype, *std::move(shape), offs[0].get<uint64_t>(), offs[1].get<uint64_t>()};
  // Overflow-safe byte count: any product above the file size is already wrong.
  uint64_t expect = dtype_size(e.dtype);
  for (int64_t d : e.shape) {
    if (__builtin_mul_overflow(expect, static_cast<uint64_t>(d), &expect)) {
      return absl::DataLossError(where + "shape overflows");
    }
  }
  if (e.end < e.begin || e.end - e.begin != expect) {
    return absl::DataLossError(absl::StrCat(where, "data_offsets [", e.begin, ", ", e.end,
                                            ") do not match ", dtype_name(e.dtype), " shape [",
                                            absl::StrJoin(e.shape, ", "), "]"));
  }
  if (e.end > data_size) {
    return absl::DataLossError(absl::StrCat(where, "data [", e.begin, ", ", e.end,
                                            ") runs past the end of the file (", data_size,
                                            " data bytes): truncated"));
  }
  if (e.begin % dtype_size(e.dtype) != 0) {
    return absl::DataLossError(absl::StrCat(where, "data_offsets begin ", e.begin,
                                            " is not a multiple of the ", dtype_name(e.dtype),
                                            " element size"));
  }
  return e;
}

// The tensors tile the data exactly: no overlap, no hole, nothing after the last one.
absl::Status check_layout(const std::string& path, std::vector<Extent> extents,
                          uint64_t data_size) {
  std::sort(extents.begin(), extents.end(), [](const Extent& a, const Extent& b) {
    return std::tie(a.begin, a.end) < std::tie(b.begin, b.end);
  });
  uint64_t covered = 0;
  for (const Extent& e : extents) {
    if (e.begin != covered) {
      return absl::DataLossError(
          absl::StrCat(path, ": tensor '", e.name, "': data_offsets [", e.begin, ", ", e.end, ") ",
                       e.begin < covered ? "overlap another tensor" : "leave a hole",
                       " (bytes before it end at ", covered, ")"));
    }
    covered = e.end;
  }
  if (covered != data_size) {
    return absl::DataLossError(
        absl::StrCat(path, ": the tensors cover ", covered, " of ", data_size, " data bytes"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<DType> parse_dtype(const std::string& name) {
  if (name == "F32") return DType::kF32;
  if (name == "F16") return DType::kF16;
  if (name == "BF16") return DType::kBF16;
  if (name == "I32") return DType::kI32;
  if (name == "I64") return DType::kI64;
  if (name == "U8") return DType::kU8;
  if (name == "I8") return DType::kI8;
  return absl::InvalidArgumentError(absl::StrCat("unsupported dtype ", name));
}

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::kF32:
    case DType::kI32:
      return 4;
    case DType::kF16:
    case DType::kBF16:
      return 2;
    case DType::kI64:
      return 8;
    case DType::kU8:
    case DType::kI8:
      return 1;
  }
  return 0;
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "F32";
    case DType::kF16:
      return "F16";
    case DType::kBF16:
      return "BF16";
    case DType::kI32:
      return "I32";
    case DType::kI64:
      return "I64";
    case DType::kU8:
      return "U8";
    case DType::kI8:
      return "I8";
  }
  return "?";
}

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::open(const std::string& path) {
  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = path;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return absl::NotFoundError(absl::StrCat(path, ": cannot open: ", std::strerror(errno)));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a regular file"));
  }
  file->size_ = static_cast<size_t>(st.st_size);
  if (file->size_ > 0) {
    void* p = ::mmap(nullptr, file->size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      ::close(fd);
      return absl::InternalError(absl::StrCat(path, ": mmap failed: ", std::strerror(errno)));
    }
    file->base_ = static_cast<const std::byte*>(p);
  }
  ::close(fd);
  if (absl::Status s = file->parse_header(); !s.ok()) return s;
  return file;
}

SafetensorsFile::~SafetensorsFile() {
  if (base_ != nullptr) ::munmap(const_cast<std::byte*>(base_), size_);
}

absl::Status SafetensorsFile::parse_header() {
  if (size_ < 8) {
    return absl::DataLossError(absl::StrCat(path_, ": truncated (", size_, " bytes, no header)"));
  }
  uint64_t header_len = 0;
  std::memcpy(&header_len, base_, 8);  // little-endian host (x86-64, aarch64)
  if (header_len > size_ - 8) {
    return absl::DataLossError(absl::StrCat(path_, ": header length ", header_len,
                                            " runs past the end of the file (", size_, " bytes)"));
  }
  if (header_len > kMaxHeaderBytes) {
    return absl::DataLossError(absl::StrCat(path_, ": header length ", header_len,
                                            " is over the limit of ", kMaxHeaderBytes, " bytes"));
  }
  const char* text = reinterpret_cast<const char*>(base_ + 8);
  if (!json_depth_within(std::string_view(text, header_len))) {
    return absl::DataLossError(
        absl::StrCat(path_, ": header nests deeper than ", kMaxJsonDepth, " levels"));
  }
  const nlohmann::json header = nlohmann::json::parse(text, text + header_len, nullptr, false);
  if (header.is_discarded() || !header.is_object()) {
    return absl::DataLossError(absl::StrCat(path_, ": header is not a JSON object"));
  }
  const size_t data_begin = 8 + header_len;
  const size_t data_size = size_ - data_begin;
  std::vector<Extent> extents;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      if (entry.is_object()) {
        for (const auto& [k, v] : entry.items()) {
          metadata_[k] = v.is_string() ? v.get<std::string>() : v.dump();
        }
      }
      continue;
    }
    absl::StatusOr<Extent> extent = parse_entry(path_, name, entry, data_size);
    if (!extent.ok()) return extent.status();
    TensorView view{extent->dtype, std::move(extent->shape), {}};
    view.bytes =
        std::span<const std::byte>(base_ + data_begin + extent->begin, extent->end - extent->begin);
    extents.push_back(*std::move(extent));
    tensors_.emplace(name, std::move(view));
  }
  return check_layout(path_, std::move(extents), data_size);
}

absl::StatusOr<TensorView> SafetensorsFile::get(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) {
    return absl::NotFoundError(absl::StrCat(path_, ": missing tensor '", name, "'"));
  }
  return it->second;
}

std::vector<float> to_float32(const TensorView& t) {
  const size_t n = static_cast<size_t>(t.numel());
  std::vector<float> out(n);
  const std::byte* p = t.bytes.data();
  switch (t.dtype) {
    case DType::kF32:
      std::memcpy(out.data(), p, n * 4);
      break;
    case DType::kF16:
      for (size_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, p + 2 * i, 2);
        out[i] = f16_to_f32(h);
      }
      break;
    case DType::kBF16:
      for (size_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, p + 2 * i, 2);
        out[i] = bf16_to_float(h);
      }
      break;
    default:
      out.clear();  // not a float tensor: callers check the dtype first
  }
  return out;
}

}  // namespace fpa
