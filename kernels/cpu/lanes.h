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

// 16 int32 lanes, for masks and slot positions.
typedef int32_t Ints __attribute__((vector_size(64)));

// Whether any lane of a mask is set: a tree of ORs (a loop over the lanes compiled to 16 lane
// extractions).
[[gnu::always_inline]] inline bool any(Ints mask) {
  typedef int32_t Half __attribute__((vector_size(32)));
  typedef int32_t Quarter __attribute__((vector_size(16)));
  const Half h = __builtin_shufflevector(mask, mask, 0, 1, 2, 3, 4, 5, 6, 7) |
                 __builtin_shufflevector(mask, mask, 8, 9, 10, 11, 12, 13, 14, 15);
  const Quarter q =
      __builtin_shufflevector(h, h, 0, 1, 2, 3) | __builtin_shufflevector(h, h, 4, 5, 6, 7);
  return ((q[0] | q[1]) | (q[2] | q[3])) != 0;
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

// The largest lane: a tree, as hsum (a loop over the lanes compiled to a chain of 15 lane
// extractions and maxima, once per block of the decode attention kernel).
[[gnu::always_inline]] inline float hmax(Lanes v) {
  typedef float Half __attribute__((vector_size(32)));
  typedef float Quarter __attribute__((vector_size(16)));
  const Half a = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7);
  const Half b = __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
  const Half h = a > b ? a : b;
  const Quarter c = __builtin_shufflevector(h, h, 0, 1, 2, 3);
  const Quarter d = __builtin_shufflevector(h, h, 4, 5, 6, 7);
  const Quarter q = c > d ? c : d;
  const float x = q[0] > q[1] ? q[0] : q[1], y = q[2] > q[3] ? q[2] : q[3];
  return x > y ? x : y;
}

// hsum of each of 16 vectors at once, out[j] = hsum(v[j]) bit for bit (the same additions in
// the same order): a tree of shuffles and adds, about 2 operations per vector where hsum takes 7.
[[gnu::always_inline]] inline Lanes hsum16(const Lanes (&v)[16]) {
  Lanes u[8], x[4], y[2];
  // Lanes i + (i + 8): u[j] holds vector j's 8 sums, then vector j + 8's.
  for (int j = 0; j < 8; ++j) {
    u[j] = __builtin_shufflevector(v[j], v[j + 8], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21,
                                   22, 23) +
           __builtin_shufflevector(v[j], v[j + 8], 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28,
                                   29, 30, 31);
  }
  // Then i + (i + 4): x[j] holds 4 sums each of vectors j, j + 4, j + 8, j + 12.
  for (int j = 0; j < 4; ++j) {
    x[j] = __builtin_shufflevector(u[j], u[j + 4], 0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25,
                                   26, 27) +
           __builtin_shufflevector(u[j], u[j + 4], 4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28,
                                   29, 30, 31);
  }
  // Then (0 + 1) and (2 + 3) of each 4: y[j] holds 2 sums of vectors j, j + 2, ..., j + 14.
  for (int j = 0; j < 2; ++j) {
    y[j] = __builtin_shufflevector(x[j], x[j + 2], 0, 2, 16, 18, 4, 6, 20, 22, 8, 10, 24, 26, 12,
                                   14, 28, 30) +
           __builtin_shufflevector(x[j], x[j + 2], 1, 3, 17, 19, 5, 7, 21, 23, 9, 11, 25, 27, 13,
                                   15, 29, 31);
  }
  return __builtin_shufflevector(y[0], y[1], 0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14,
                                 30) +
         __builtin_shufflevector(y[0], y[1], 1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15,
                                 31);
}

// exp of 16 lanes at once (Cephes' expf polynomial, within 2 ulp) for x <= 88, with a cut: lanes
// below -80 (-inf among them) give 0, a term < 1e-34 of a largest term of 1. A libm call per
// value would also spill the registers of the loop around it.
[[gnu::always_inline]] inline Lanes exp_lanes(Lanes x) {
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
