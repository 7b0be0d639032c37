#include "kernels/cuda/step_graph.h"

#include "absl/cleanup/cleanup.h"
#include "kernels/cuda/device_memory.h"
#include "model/status_macros.h"

namespace fpa::cuda {

StepGraph::~StepGraph() {
  if (exec_) cudaGraphExecDestroy(exec_);
}

absl::Status StepGraph::run(cudaStream_t stream, const std::function<absl::Status()>& launches) {
  FPA_RETURN_IF_ERROR(cuda_status(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal),
                                  "graph capture begin"));
  const absl::Status enqueued = launches();
  cudaGraph_t graph = nullptr;
  // The capture ends whatever happened inside it, or the stream would stay in capture mode.
  const cudaError_t ended = cudaStreamEndCapture(stream, &graph);
  absl::Cleanup destroy = [graph] {
    if (graph) cudaGraphDestroy(graph);
  };
  FPA_RETURN_IF_ERROR(enqueued);
  FPA_RETURN_IF_ERROR(cuda_status(ended, "graph capture end"));
  FPA_RETURN_IF_ERROR(instantiate(graph));
  return cuda_status(cudaGraphLaunch(exec_, stream), "graph launch");
}

absl::Status StepGraph::instantiate(cudaGraph_t graph) {
  if (exec_) {
    cudaGraphExecUpdateResultInfo info;
    if (cudaGraphExecUpdate(exec_, graph, &info) == cudaSuccess) return absl::OkStatus();
    cudaGetLastError();  // a topology change is expected now and then, not an error
    cudaGraphExecDestroy(exec_);
    exec_ = nullptr;
  }
  return cuda_status(cudaGraphInstantiate(&exec_, graph, 0), "graph instantiate");
}

}  // namespace fpa::cuda
