// What --cpu-weights auto and --kv-dtype auto pick (issue 26): the most compact format this CPU
// runs among those whose accuracy loss on the model was measured within bounds.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "model/model.h"

namespace fpa {

struct CpuFormats {
  std::string weights;  // f32 | bf16 | int8
  std::string kv;       // f32 | bf16
};

// What the CPU offers the weight formats.
struct CpuFeatures {
  bool bf16 = false;  // AVX512-BF16
  bool vnni = false;  // AVX512-VNNI
};

CpuFeatures this_cpu();

// Explicit choices pass through (the backend refuses one the CPU lacks). "auto" is the model's
// most compact measured format (ModelConfig::compact_weights, compact_kv), stepped down to one
// the CPU runs: int8 weights need VNNI, bf16 weights AVX512-BF16; bf16 KV pages run anywhere.
// Fewer bytes are taken to be faster: every format's decode is bound by the bytes it reads.
// TODO(issue 26): int8 against bf16 on the shipped model is that assumption until the lead's
// quiet-machine run (bench/RESULTS.md) confirms it.
CpuFormats resolve_cpu_formats(std::string_view weights, std::string_view kv, const ModelConfig& c,
                               CpuFeatures cpu);

struct LoadedForCpu {
  std::unique_ptr<Model> model;
  CpuFormats formats;
};

// The model in `dir` loaded for the CPU formats `weights` and `kv` name ("auto" resolved from its
// config.json, read first, and this CPU): bf16 and int8 weights keep a BF16 file's projections as
// stored, int8 an I8 file's too, with no float32 copy (LoadOptions).
absl::StatusOr<LoadedForCpu> load_for_cpu(const std::string& dir, std::string_view weights,
                                          std::string_view kv);

}  // namespace fpa
