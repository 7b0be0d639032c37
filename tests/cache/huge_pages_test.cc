#include "cache/huge_pages.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

namespace fpa::cache {
namespace {

constexpr size_t kHugePage = size_t{2} << 20;

// The kernel's THP mode: "always", "madvise" or "never" (the bracketed word of the file).
std::string thp_mode() {
  std::ifstream in("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t open = all.find('['), close = all.find(']');
  return open == std::string::npos ? "" : all.substr(open + 1, close - open - 1);
}

// /proc/self/smaps' THPeligible for the mapping holding p: whether the kernel may back it with
// huge pages (what the advice changes in madvise mode); -1 where the line is missing.
int thp_eligible(const void* p) {
  const auto at = reinterpret_cast<uintptr_t>(p);
  std::ifstream in("/proc/self/smaps");
  bool inside = false;
  for (std::string line; std::getline(in, line);) {
    uintptr_t lo = 0, hi = 0;
    char dash = 0;
    std::istringstream head(line);
    if (head >> std::hex >> lo >> dash >> hi && dash == '-') inside = lo <= at && at < hi;
    if (inside && line.rfind("THPeligible:", 0) == 0) return std::stoi(line.substr(12));
  }
  return -1;
}

TEST(HugePages, LargeBuffersAre2MiBAlignedAndAdvised) {
  const size_t bytes = 3 * kHugePage + 12345;
  HugeBuffer b = allocate_huge(bytes);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b.get()) % kHugePage, 0u);
  std::memset(b.get(), 1, bytes);  // every byte is the caller's
  const std::string mode = thp_mode();
  if (mode == "never" || mode.empty()) GTEST_SKIP() << "no transparent huge pages here";
  EXPECT_EQ(thp_eligible(b.get()), 1) << "THP mode " << mode;
}

TEST(HugePages, SmallBuffersKeepSmallPagesAndCacheLineAlignment) {
  for (size_t bytes : {size_t{1}, size_t{4096}, kHugePage - 1}) {
    HugeBuffer b = allocate_huge(bytes);
    ASSERT_NE(b, nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(b.get()) % 64, 0u) << bytes;
    std::memset(b.get(), 1, bytes);
  }
}

}  // namespace
}  // namespace fpa::cache
