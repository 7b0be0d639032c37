// What the oneDNN projections (bf16_linear, int8_linear) share: the engine, weights packed once
// into the blocked layout oneDNN's matmul picks, one primitive per shape, and running one on
// the pool's threads.
#pragma once

#include <oneapi/dnnl/dnnl.hpp>

#include "cache/huge_pages.h"

namespace fpa::cpu {

class ThreadPool;

const dnnl::engine& onednn_engine();

// Weights [rows, cols] of `dtype` at `bits` (row-major, as PyTorch's Linear holds them), packed
// in the layout oneDNN picks for a product of 64 tokens of `src` dtype into `dst` dtype (the
// blocked layout of its brgemm kernels). Every primitive of any token count reads that one copy.
// The copy lies on huge pages: decode streams every weight once a step.
struct PackedWeights {
  cache::HugeBuffer bits;
  dnnl::memory mem;  // over `bits`
};
PackedWeights pack_weights(const void* bits, int rows, int cols, dnnl::memory::data_type dtype,
                           dnnl::memory::data_type src, dnnl::memory::data_type dst);

// Where `packed` holds 64 outputs by groups of `group` inputs (oneDNN's AVX512 dot-product
// layouts: pairs for bf16, quads for int8): the distance between blocks of 64 outputs, whose
// groups are 64 * group values apart; 0 for any other layout.
long dot_block(const dnnl::memory& packed, int group, int cols);

// The matmul y[n, rows] (+)= x[n, cols] * w^T for weights packed by pack_weights, cached by
// shape, token count, dtypes and accumulation: a primitive binds no weights, and the token
// counts a server sees repeat (batch sizes, chunk lengths).
dnnl::matmul matmul(const dnnl::memory& packed, int rows, int cols, int n,
                    dnnl::memory::data_type src, dnnl::memory::data_type dst, bool accumulate);

// Runs `mm` on the pool's threads (OpenMP's, which oneDNN and the pool share) and waits.
void run_matmul(const dnnl::matmul& mm, const dnnl::memory& src, const dnnl::memory& packed,
                const dnnl::memory& dst, ThreadPool* pool);

// Row-major [n, cols] of `dtype`, dense: oneDNN's brgemm refuses padded rows.
inline dnnl::memory::desc rows_desc(int n, int cols, dnnl::memory::data_type dtype) {
  return dnnl::memory::desc({n, cols}, dtype, dnnl::memory::format_tag::ab);
}

}  // namespace fpa::cpu
