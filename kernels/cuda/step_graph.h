// A step's launches run as one CUDA graph. The step is captured from the stream every time (its
// batch, page tables and split counts change from step to step), and the executable graph of the
// previous step is updated in place when the new one has the same shape, which costs far less
// than instantiating; the device then runs the whole step back to back instead of paying a
// launch gap per kernel.
#pragma once

#include <cuda_runtime.h>

#include <functional>

#include "absl/status/status.h"

namespace fpa::cuda {

class StepGraph {
 public:
  StepGraph() = default;
  StepGraph(const StepGraph&) = delete;
  StepGraph& operator=(const StepGraph&) = delete;
  ~StepGraph();

  // Captures what `launches` enqueues on `stream` (it must not wait on the stream, copy to
  // pageable memory or allocate) and launches it as a graph.
  absl::Status run(cudaStream_t stream, const std::function<absl::Status()>& launches);

 private:
  absl::Status instantiate(cudaGraph_t graph);

  cudaGraphExec_t exec_ = nullptr;
};

}  // namespace fpa::cuda
