// Bytes -> a model directory -> Model::load. The input is a 4-byte little-endian length, that many
// bytes of config.json, and the rest is model.safetensors. A loaded model's weights are read in
// full, so that a tensor pointing outside its file is an ASan report.
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

#include "model/model.h"

namespace {

// In memory (/dev/shm) where there is one: two files are written per input.
const std::string& scratch_dir() {
  static const std::string dir = [] {
    std::string tmpl = ::access("/dev/shm", W_OK) == 0 ? "/dev/shm/fpa-fuzz-model-XXXXXX"
                                                       : "/tmp/fpa-fuzz-model-XXXXXX";
    if (::mkdtemp(tmpl.data()) == nullptr) std::abort();
    return tmpl;
  }();
  return dir;
}

void write_file(const std::string& path, const uint8_t* data, size_t size) {
  std::ofstream(path, std::ios::binary | std::ios::trunc)
      .write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
}

float touch(const fpa::Matrix& m) {
  float s = 0;
  for (size_t i = 0; i < static_cast<size_t>(m.rows) * m.cols; ++i) s += m.data[i];
  return s;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  uint32_t config_len = 0;
  if (size < 4) return 0;
  std::memcpy(&config_len, data, 4);
  if (config_len > size - 4) return 0;
  write_file(scratch_dir() + "/config.json", data + 4, config_len);
  write_file(scratch_dir() + "/model.safetensors", data + 4 + config_len, size - 4 - config_len);
  absl::StatusOr<std::unique_ptr<fpa::Model>> model = fpa::Model::load(scratch_dir());
  if (!model.ok()) return 0;
  volatile float sink = touch((*model)->embed()) + touch((*model)->lm_head());
  for (const fpa::LayerWeights& w : (*model)->layers()) {
    sink = sink + touch(w.wq) + touch(w.wk) + touch(w.wv) + touch(w.wo) + touch(w.w_gate) +
           touch(w.w_up) + touch(w.w_down) + touch(w.field_w) + touch(w.level_w);
  }
  for (float x : (*model)->final_norm()) sink = sink + x;
  return 0;
}
