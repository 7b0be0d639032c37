#include "cache/huge_pages.h"

#include <sys/mman.h>

#include <new>

namespace fpa::cache {
namespace {

constexpr size_t kHugePage = size_t{2} << 20;
size_t alignment(size_t bytes) { return bytes >= kHugePage ? kHugePage : 64; }

}  // namespace

void HugeFree::operator()(std::byte* p) const {
  ::operator delete (p, std::align_val_t{alignment(bytes)});
}

HugeBuffer allocate_huge(size_t bytes) {
  const size_t align = alignment(bytes);
  auto* p = static_cast<std::byte*>(::operator new (bytes, std::align_val_t{align}, std::nothrow));
  if (p != nullptr && align == kHugePage) madvise(p, bytes, MADV_HUGEPAGE);
  return HugeBuffer(p, HugeFree{bytes});
}

}  // namespace fpa::cache
