// Large buffers read in long streams (the KV cache's page pool, the CPU backend's packed
// weights), on 2 MiB pages: advised, so they hold where the kernel's transparent huge pages are
// in `madvise` mode (this host's) as in `always`. A TLB miss every 4 KiB slowed both: decode
// attention over scattered pages ran 10-30% faster on 2 MiB pages, and the 1-token int8
// product read its weights at 0.85 of the read loop against 0.75 (bench/RESULTS.md).
#pragma once

#include <cstddef>
#include <memory>

namespace fpa::cache {

// Frees what allocate_huge returned; `bytes` is the size it was asked for.
struct HugeFree {
  size_t bytes = 0;
  void operator()(std::byte* p) const;
};
using HugeBuffer = std::unique_ptr<std::byte[], HugeFree>;

// `bytes` of memory, 2 MiB aligned and advised as huge pages where it fills one (64-byte aligned
// otherwise); null where the allocation fails. Advice only: where the kernel has no transparent
// huge pages the buffer keeps small ones.
HugeBuffer allocate_huge(size_t bytes);

}  // namespace fpa::cache
