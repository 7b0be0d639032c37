// Intel AMX's int8 tiles for the hand-written int8 kernel's blocks (int8_linear.cc): one
// instruction multiplies 16 tokens' 64 bytes by 64 bytes of 16 outputs, 16 times the work of a
// vpdpbusd, so the products of 8 to 128 tokens read their weights at the memory's rate where the
// VNNI kernel computes longer than it reads (bench/RESULTS.md, 2026-12-06, seventh session).
// The sums are the same int32 as the VNNI kernel's, so either gives the same outputs.
#pragma once

#include <cstdint>

namespace fpa::cpu {

// Whether this CPU has AMX-TILE and AMX-INT8 and the OS lets this process use the tiles (asked
// for once, as Linux requires before a thread's first tile instruction).
bool cpu_has_amx_int8();

// Tokens a tile holds.
inline constexpr int kAmxTileTokens = 16;

// What a pass over a block asks the memory for ahead of its loads, per 64 inputs (4 KiB of the
// block): `bytes` from `from` on, one step further each time. The tile loads wait for their lines,
// and the hardware's prefetcher alone read 14-17 GB/s of weights at 2 to 16 tokens where 20 came
// with a chunk asked for ahead. The lines are asked for into the L2, not the L1 (prefetcht1): into
// the L1 (prefetcht0), likely held up by its few fill buffers, the products of 32 tokens read 19-20
// GB/s of weights from DRAM where into the L2 they read 25-28 (bench/RESULTS.md, 2026-12-06,
// eighth session).
struct AmxAhead {
  const int8_t* from;
  int bytes;
};

// For pass `pass` of `passes` over `block` (one a tile of tokens): two chunks ahead in the block
// where one pass reads it; else each pass a share of the next block (`next`; none: nullptr), as
// the passes after the first read this one from the L2.
AmxAhead amx_ahead(const int8_t* block, const int8_t* next, int quads, int pass, int passes);

// acc[t][0, 64) = the int32 sums of `size` (1 to kAmxTileTokens) tokens against one block of 64
// outputs in oneDNN's VNNI layout (per quad of inputs, 64 outputs x 4 inputs; `quads` of them, a
// multiple of 16). `lines`: the tokens' bytes as quantize_tile_tokens lays out one tile, each
// 64 inputs a line per token, the tokens' lines of one 64 inputs one after another. Requires
// cpu_has_amx_int8().
void amx_dot_block(const int8_t* block, int quads, const uint8_t* lines, int size, AmxAhead ahead,
                   int32_t (*acc)[64]);

}  // namespace fpa::cpu
