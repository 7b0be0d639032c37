// Bytes -> SafetensorsFile::open (from an in-memory file) and every tensor converted to float32:
// whatever the header says, no read may leave the mapping (ASan would report it).
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <string>

#include "model/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const int fd = ::memfd_create("fuzz.safetensors", MFD_CLOEXEC);
  if (fd < 0 || ::write(fd, data, size) != static_cast<ssize_t>(size)) return 0;
  absl::StatusOr<std::unique_ptr<fpa::SafetensorsFile>> file =
      fpa::SafetensorsFile::open("/proc/self/fd/" + std::to_string(fd));
  ::close(fd);
  if (!file.ok()) return 0;
  volatile float sink = 0;
  for (const auto& [name, view] : (*file)->tensors()) {
    for (float x : fpa::to_float32(view)) sink = sink + x;
  }
  return 0;
}
