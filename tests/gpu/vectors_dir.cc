#include "tests/gpu/vectors_dir.h"

#include <cstdlib>
#include <filesystem>
#include <system_error>

namespace fpa {

std::string vectors_dir() {
  if (const char* env = std::getenv("FPA_VECTORS_DIR"); env != nullptr && *env != '\0') return env;
  std::error_code ec;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    const std::filesystem::path bundled = exe.parent_path().parent_path() / "tests" / "vectors";
    if (std::filesystem::is_directory(bundled, ec)) return bundled.string();
  }
  return FPA_VECTORS_DIR;
}

std::string repo_path(const std::string& relative) {
  return (std::filesystem::path(vectors_dir()).parent_path().parent_path() / relative).string();
}

}  // namespace fpa
