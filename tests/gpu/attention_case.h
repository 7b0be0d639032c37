// Random inputs for one launch of the CUDA attention kernels (kernels/cuda/device_kernels.h) and
// what the CPU kernels (kernels/cpu/attention.h) make of them: kernel_test.cc holds the device to
// that. Plain C++, so the inputs' coverage is checked on machines without a GPU too.
#pragma once

#include <cstdint>
#include <vector>

namespace fpa::gpu_test {

// A stream's page count that stands for one page whose every slot is free (all its keys died but
// the page is still listed).
inline constexpr int kAllFreePage = -1;

// One sequence of the batch: `len` rows (1: a decode token, more: a prompt chunk) over a cache
// whose stream for head h holds pages[h] pages (0: an emptied stream, no pages at all).
struct ItemSpec {
  int len = 1;
  std::vector<int> pages;
};

struct CaseSpec {
  int head_dim = 16;
  bool bf16 = false;        // cached k and v hold bf16 values, as a bf16 device pool stores them
  std::vector<float> beta;  // per head; 0: no penalty and no eviction (softmax)
  float tau = 3.0f;
  std::vector<ItemSpec> items;
  uint32_t seed = 1;
};

// A page pool (slot index = page * page_slots + slot, as PoolView) and one layer's batch laid out
// as AttentionArgs takes it. Free slots hold NaN keys, values, levels and minima.
struct AttentionCase {
  int head_dim = 0, n_heads = 0, page_slots = 16, pages = 0;
  bool bf16 = false;
  std::vector<float> k, v;  // [pages * page_slots][head_dim]
  std::vector<float> lvl, m;
  std::vector<int32_t> pos;  // -1: free
  int rows = 0, items = 0, qkv_stride = 0;
  std::vector<float> qkv;            // [rows][qkv_stride]: q | k | v
  std::vector<float> phi, lvl_rows;  // [rows][n_heads]
  std::vector<float> cmin;           // [rows][n_heads]: min phi over the item's rows up to this
  std::vector<int32_t> row_item;     // [rows]
  std::vector<int32_t> item_row0, item_len, item_pos0;
  std::vector<float> thr;   // [items][n_heads]: tau / beta, +inf for beta 0
  std::vector<float> beta;  // [n_heads]
  std::vector<int32_t> page_ids, page_off, page_cnt;  // stream (item, head) = item * n_heads + h
};

AttentionCase make_case(const CaseSpec& spec);

// What the device must leave: out [rows][n_heads * head_dim], and m and pos of every pool slot
// (cached keys' minima lowered by the batch's field, keys that die freed, all else untouched).
struct Expected {
  std::vector<float> out, m;
  std::vector<int32_t> pos;
};
Expected cpu_expected(const AttentionCase& c);

}  // namespace fpa::gpu_test
