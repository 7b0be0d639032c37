#include "kernels/cpu/int8_amx.h"

#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace fpa::cpu {
namespace {

// Linux keeps the tiles' 8 KiB of state off until a process asks (arch_prctl, Linux 5.16+).
constexpr int kArchReqXcompPerm = 0x1023;
constexpr int kXfeatureXtiledata = 18;

bool detect() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid_count(7, 0, &a, &b, &c, &d) == 0) return false;
  const bool tile = (d >> 24) & 1, int8 = (d >> 25) & 1;
  return tile && int8 && syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
}

// ldtilecfg's 64 bytes: palette 1, each tile's rows and bytes a row.
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};
static_assert(sizeof(TileConfig) == 64);

// Tiles 0-3: the sums of the block's four columns of 16 outputs; 4: the tokens' bytes; 5 and 6:
// a column's weights, in turn.
TileConfig config(int size) {
  TileConfig c;
  for (int t = 0; t < 7; ++t) {
    c.rows[t] = static_cast<uint8_t>(t < 5 ? size : 16);
    c.colsb[t] = 64;
  }
  return c;
}

}  // namespace

bool cpu_has_amx_int8() {
  static const bool has = detect();
  return has;
}

AmxAhead amx_ahead(const int8_t* block, const int8_t* next, int quads, int pass, int passes) {
  if (next == nullptr || passes == 1) return {block + 2 * 4096, 4096};
  const int bytes = (4096 / passes + 63) / 64 * 64;
  return {next + static_cast<long>(pass) * bytes * (quads / 16), bytes};
}

// The configuration is loaded on every call: oneDNN's AMX products on the same thread load their
// own in between, and a block (128 KiB at 2048 inputs) takes far longer than loading it.
[[gnu::target("amx-tile,amx-int8")]] void amx_dot_block(const int8_t* block, int quads,
                                                        const uint8_t* lines, int size,
                                                        AmxAhead ahead, int32_t (*acc)[64]) {
  const TileConfig c = config(size);
  _tile_loadconfig(&c);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (int g = 0; g < quads / 16; ++g) {
    const int8_t* w = block + g * 4096L;  // 16 quads x 64 outputs x 4 inputs
    const int8_t* lead = ahead.from + g * ahead.bytes;
    for (int l = 0; l < ahead.bytes; l += 64) __builtin_prefetch(lead + l, 0, 2);  // prefetcht1
    _tile_loadd(4, lines + g * size * 64L, 64);
    _tile_loadd(5, w, 256);
    _tile_dpbusd(0, 4, 5);
    _tile_loadd(6, w + 64, 256);
    _tile_dpbusd(1, 4, 6);
    _tile_loadd(5, w + 128, 256);
    _tile_dpbusd(2, 4, 5);
    _tile_loadd(6, w + 192, 256);
    _tile_dpbusd(3, 4, 6);
  }
  _tile_stored(0, acc[0], 256);
  _tile_stored(1, acc[0] + 16, 256);
  _tile_stored(2, acc[0] + 32, 256);
  _tile_stored(3, acc[0] + 48, 256);
  _tile_release();
}

}  // namespace fpa::cpu
