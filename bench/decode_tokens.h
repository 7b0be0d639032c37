// The token stream both decode benchmarks feed (bench/decode_reference.py has the same
// function): BOS, then pseudo-random bytes that depend on the sequence and the position. Every
// sequence of a batch gets the prompt of sequence 0 and then its own continuation.
#pragma once

#include <cstdint>

namespace fpa::bench {

inline int32_t bench_token(int64_t seq, int64_t pos) {
  if (pos == 0) return 256;  // BOS
  const uint64_t x =
      (1103515245ull * static_cast<uint64_t>(seq * 100003 + pos) + 12345ull) & 0x7fffffffull;
  return static_cast<int32_t>((x >> 16) % 256);
}

}  // namespace fpa::bench
