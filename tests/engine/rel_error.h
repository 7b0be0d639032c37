// The parity tests' error measure, shared by the CPU and CUDA suites.
#pragma once

#include <algorithm>
#include <cmath>
#include <span>

namespace fpa {

// max |ours - reference| / max |reference|: one scale for a whole logits or activations tensor.
inline double rel_error(std::span<const float> ours, std::span<const float> ref) {
  double err = 0.0, scale = 0.0;
  for (size_t i = 0; i < ref.size(); ++i) {
    err = std::max(err, std::fabs(double(ours[i]) - ref[i]));
    scale = std::max(scale, std::fabs(double(ref[i])));
  }
  return err / std::max(scale, 1e-30);
}

}  // namespace fpa
