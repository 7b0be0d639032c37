// A Model with random weights of any size, for benchmarks: the field has no input weights and a
// constant bias, so the walk falls by `drift` per token and, with tied levels, tau = 20 and
// beta = 1, every head keeps exactly the last 20 / drift keys: a controlled eviction rate.
#pragma once

#include <cstdint>
#include <memory>

#include "model/model.h"

namespace fpa::bench {

struct SyntheticShape {
  int d_model = 1024;
  int n_layers = 4;
  int n_heads = 8;
  int head_dim = 128;
  int d_ff = 2816;
  float drift = 20.0f / 256.0f;
};

std::unique_ptr<Model> make_synthetic_model(const SyntheticShape& shape, uint32_t seed);

}  // namespace fpa::bench
