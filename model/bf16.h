// bf16, the upper half of a float32's bits: the conversions the weights (safetensors,
// kernels/cpu/bf16_linear.cc) and the bf16 KV cache pages share.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>

namespace fpa {

// Round to nearest even, as the hardware conversion does; NaN stays NaN.
inline uint16_t round_to_bf16(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

inline float bf16_to_float(uint16_t b) { return std::bit_cast<float>(uint32_t{b} << 16); }

// f as a bf16 would hold it, back in float32.
inline float through_bf16(float f) { return bf16_to_float(round_to_bf16(f)); }

inline void to_bf16(const float* x, size_t n, uint16_t* out) {
  for (size_t i = 0; i < n; ++i) out[i] = round_to_bf16(x[i]);
}

}  // namespace fpa
