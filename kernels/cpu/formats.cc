#include "kernels/cpu/formats.h"

#include "kernels/cpu/bf16_linear.h"
#include "kernels/cpu/int8_linear.h"
#include "model/config.h"
#include "model/json_fields.h"

namespace fpa {
namespace {

std::string auto_weights(const std::string& compact, CpuFeatures cpu) {
  if (compact == "int8" && cpu.vnni) return "int8";
  if ((compact == "int8" || compact == "bf16") && cpu.bf16) return "bf16";
  return "f32";
}

}  // namespace

CpuFeatures this_cpu() { return {cpu::cpu_has_bf16(), cpu::cpu_has_vnni()}; }

CpuFormats resolve_cpu_formats(std::string_view weights, std::string_view kv, const ModelConfig& c,
                               CpuFeatures cpu) {
  return {weights == "auto" ? auto_weights(c.compact_weights, cpu) : std::string(weights),
          kv == "auto" ? c.compact_kv : std::string(kv)};
}

absl::StatusOr<LoadedForCpu> load_for_cpu(const std::string& dir, std::string_view weights,
                                          std::string_view kv) {
  const std::string path = dir + "/config.json";
  absl::StatusOr<std::string> text = read_text_file(path);
  if (!text.ok()) return text.status();
  absl::StatusOr<ModelConfig> c = parse_model_config(*text, path);
  if (!c.ok()) return c.status();
  LoadedForCpu out{nullptr, resolve_cpu_formats(weights, kv, *c, this_cpu())};
  const bool packed = out.formats.weights != "f32";
  absl::StatusOr<std::unique_ptr<Model>> model =
      Model::load(dir, {.keep_bf16 = packed, .keep_int8 = out.formats.weights == "int8"});
  if (!model.ok()) return model.status();
  out.model = *std::move(model);
  return out;
}

}  // namespace fpa
