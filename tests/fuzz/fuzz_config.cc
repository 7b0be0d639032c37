// config.json text -> parse_model_config. Whatever it accepts must respect the documented bounds
// (docs/model-format.md), which the loader relies on before it allocates.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "model/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<fpa::ModelConfig> c = fpa::parse_model_config(text, "config.json");
  if (!c.ok()) return 0;
  const int64_t attention = int64_t{c->n_heads} * c->head_dim;
  const int64_t embed = int64_t{c->vocab_size} * c->d_model;
  if (c->n_layers > 1024 || attention > (1 << 16) || embed > (int64_t{1} << 30) || !(c->tau > 0) ||
      !(c->norm_eps > 0) || c->bos_id >= c->vocab_size) {
    std::abort();  // accepted a config outside the bounds
  }
  return 0;
}
