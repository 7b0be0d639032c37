#include "kernels/cpu/onednn.h"

#include <omp.h>

#include <map>
#include <mutex>
#include <new>
#include <tuple>
#include <utility>

#include "kernels/cpu/thread_pool.h"

namespace fpa::cpu {
namespace {

using dnnl::memory;
using Dt = memory::data_type;

// The weights as matmul's operand [cols, rows]: w^T, which w's row-major values are as "ba".
memory::desc weights_desc(int rows, int cols, Dt dtype, bool any) {
  return memory::desc({cols, rows}, dtype, any ? memory::format_tag::any : memory::format_tag::ba);
}

}  // namespace

const dnnl::engine& onednn_engine() {
  static const dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

PackedWeights pack_weights(const void* bits, int rows, int cols, Dt dtype, Dt src, Dt dst) {
  constexpr int kPackTokens = 64;
  const dnnl::matmul::primitive_desc pd(
      dnnl::matmul::desc(rows_desc(kPackTokens, cols, src), weights_desc(rows, cols, dtype, true),
                         rows_desc(kPackTokens, rows, dst)),
      onednn_engine());
  cache::HugeBuffer storage = cache::allocate_huge(pd.weights_desc().get_size());
  if (storage == nullptr) throw std::bad_alloc();
  memory packed(pd.weights_desc(), onednn_engine(), storage.get());
  memory plain(weights_desc(rows, cols, dtype, false), onednn_engine(), const_cast<void*>(bits));
  dnnl::stream s(onednn_engine());
  dnnl::reorder(plain, packed).execute(s, plain, packed);
  s.wait();
  return {std::move(storage), packed};
}

long dot_block(const memory& packed, int group, int cols) {
  const dnnl_memory_desc_t& d = packed.get_desc().data;
  const auto& blk = d.format_desc.blocking;
  const long k = d.padded_dims[0];
  const long per_step = 64L * group;  // values of one group of inputs for 64 outputs
  const bool match = d.format_kind == dnnl_blocked && blk.inner_nblks == 3 &&
                     blk.inner_blks[0] == 16 && blk.inner_idxs[0] == 0 && blk.inner_blks[1] == 64 &&
                     blk.inner_idxs[1] == 1 && blk.inner_blks[2] == group &&
                     blk.inner_idxs[2] == 0 && blk.strides[0] == 16 * per_step &&
                     blk.strides[1] == k * 64 && k % group == 0 && k >= cols;
  return match ? k * 64 : 0;
}

dnnl::matmul matmul(const memory& packed, int rows, int cols, int n, Dt src, Dt dst,
                    bool accumulate) {
  static std::mutex mu;
  static std::map<std::tuple<int, int, int, Dt, Dt, bool>, dnnl::matmul> cache;
  std::lock_guard lock(mu);
  const auto key = std::make_tuple(rows, cols, n, src, dst, accumulate);
  if (auto it = cache.find(key); it != cache.end()) return it->second;
  if (cache.size() >= 512) cache.clear();  // more shapes than a server's steps repeat
  dnnl::post_ops ops;
  if (accumulate) ops.append_sum(1.0f);
  dnnl::primitive_attr attr;
  attr.set_post_ops(ops);
  const dnnl::matmul::desc d(rows_desc(n, cols, src), packed.get_desc(), rows_desc(n, rows, dst));
  return cache.emplace(key, dnnl::matmul({d, attr, onednn_engine()})).first->second;
}

void run_matmul(const dnnl::matmul& mm, const memory& src, const memory& packed, const memory& dst,
                ThreadPool* pool) {
  thread_local dnnl::stream stream(onednn_engine());
  omp_set_num_threads(pool != nullptr ? pool->threads() : 1);
  mm.execute(stream, {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, packed}, {DNNL_ARG_DST, dst}});
  stream.wait();
}

}  // namespace fpa::cpu
