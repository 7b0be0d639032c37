// 16 floats as one GCC vector, and the few functions over them the CPU kernels share. Every
// function is inlined: a 64-byte vector passed between functions would change ABI with the
// target (-Wpsabi), and in registers the loops around them keep their state.
#pragma once

#include <cstdint>
#include <cstring>

namespace fpa::cpu {

// 16 floats as a GCC vector: lowered to what the target has (AVX-512, AVX2, SSE), and kept in
// registers where a float array would be spilled.
typedef float Lanes __attribute__((vector_size(64)));

[[gnu::always_inline]] inline Lanes load(const float* p) {
  Lanes v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

[[gnu::always_inline]] inline void store(float* p, Lanes v) { std::memcpy(p, &v, sizeof v); }

// 16 bf16 values widened to float32 (a bf16 is the upper half of a float's bits).
[[gnu::always_inline]] inline Lanes load(const uint16_t* p) {
  typedef uint16_t Halves __attribute__((vector_size(32)));
  typedef uint32_t Words __attribute__((vector_size(64)));
  Halves h;
  std::memcpy(&h, p, sizeof h);
  const Words w = __builtin_convertvector(h, Words) << 16;
  Lanes v;
  std::memcpy(&v, &w, sizeof v);
  return v;
}

[[gnu::always_inline]] inline float hsum(Lanes v) {
  typedef float Half __attribute__((vector_size(32)));
  typedef float Quarter __attribute__((vector_size(16)));
  const Half h = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7) +
                 __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
  const Quarter q =
      __builtin_shufflevector(h, h, 0, 1, 2, 3) + __builtin_shufflevector(h, h, 4, 5, 6, 7);
  return (q[0] + q[1]) + (q[2] + q[3]);
}

// exp of 16 lanes at once (Cephes' expf polynomial, within 2 ulp) for x <= 88, with a cut: lanes
// below -80 (-inf among them) give 0, a term < 1e-34 of a largest term of 1. A libm call per
// value would also spill the registers of the loop around it.
[[gnu::always_inline]] inline Lanes exp_lanes(Lanes x) {
  typedef int32_t Ints __attribute__((vector_size(64)));
  const Lanes zero = Lanes{} + 0.0f;
  const Lanes c = x < -80.0f ? zero - 80.0f : x;
  // 2^n * exp(r), n = round(x / ln 2): the magic constant rounds to the nearest integer.
  const Lanes n = (c * 1.44269504f + 12582912.0f) - 12582912.0f;
  const Lanes r = c - n * 0.693359375f + n * 2.12194440e-4f;
  Lanes p = r * 1.9875691500e-4f + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const Ints bits = (__builtin_convertvector(n, Ints) + 127) << 23;
  Lanes scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return x < -80.0f ? zero : p * scale;
}

// silu(x) = x * sigmoid(x), through exp(-|x|) (never above 1, never overflowing).
[[gnu::always_inline]] inline Lanes silu_lanes(Lanes x) {
  const Lanes zero = Lanes{} + 0.0f;
  const Lanes e = exp_lanes(x < zero ? x : zero - x);
  const Lanes one = zero + 1.0f;
  return x * ((x < zero ? e : one) / (one + e));
}

}  // namespace fpa::cpu
