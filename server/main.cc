// fpa-serve: loads a model, starts the scheduler, the gRPC server (FpaService, health,
// reflection), the /metrics endpoint and the OpenAI-compatible HTTP API, and serves until
// SIGTERM or SIGINT, then drains.
#include <sys/resource.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <iostream>
#include <limits>
#include <memory>
#include <thread>

#include "absl/strings/str_cat.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"
#include "kernels/cpu/blas_kernels.h"
#include "kernels/cpu/formats.h"
#include "kernels/cuda/cuda_backend.h"
#include "model/config.h"
#include "model/model_chat_template.h"
#include "server/engine/model_runner.h"
#include "server/grpc/acceptor.h"
#include "server/grpc/listen_socket.h"
#include "server/grpc/service.h"
#include "server/metrics/metrics.h"
#include "server/metrics/metrics_http.h"
#include "server/openai/openai_api.h"
#include "server/options.h"
#include "server/scheduler/scheduler.h"

namespace fpa::server {

constexpr const char* kServiceName = "fpa.v1.FpaService";

sigset_t stop_signals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  return set;
}

// The name clients and dashboards know the model by: --served-model-name, else the model
// folder's own name ("fpa-tiny" for models/fpa-tiny/).
std::string served_model_name(const ServeOptions& o) {
  if (!o.served_model_name.empty()) return o.served_model_name;
  std::error_code ec;
  std::filesystem::path dir = std::filesystem::weakly_canonical(o.model, ec);
  if (ec) dir = o.model;
  if (dir.filename().empty()) dir = dir.parent_path();
  return dir.filename().string();
}

// The model as the backend reads it: for the CPU, in the formats the flags name ("auto"
// resolved; the server logs the pick and ModelInfo reports it).
absl::StatusOr<LoadedForCpu> load_model(const ServeOptions& o, bool use_cuda) {
  if (!use_cuda) return load_for_cpu(o.model, o.cpu_weights, o.kv_dtype);
  absl::StatusOr<std::unique_ptr<Model>> m = Model::load(o.model);
  if (!m.ok()) return m.status();
  return LoadedForCpu{*std::move(m), {}};
}

absl::StatusOr<std::unique_ptr<Backend>> make_backend(const ServeOptions& o, const Model& model,
                                                      cache::KvCache& cache, bool use_cuda,
                                                      const CpuFormats& formats) {
  if (use_cuda) return make_cuda_backend(model, cache);
  int threads = o.threads > 0 ? o.threads : static_cast<int>(std::thread::hardware_concurrency());
  return make_cpu_backend(model, cache, std::max(threads, 1), cpu_weights_named(formats.weights));
}

absl::StatusOr<std::unique_ptr<cache::KvCache>> make_cache(const ServeOptions& o,
                                                           const ModelConfig& c, bool use_cuda,
                                                           const CpuFormats& formats) {
  // A device backend keeps keys and values in its own memory, at its own dtype; the cache then
  // does the bookkeeping and counts the device's bytes.
  const int host_kv_bytes = formats.kv == "bf16" ? 2 : 4;
  const cache::CacheShape shape{c.n_layers, c.n_heads, c.head_dim, o.page_slots,
                                use_cuda ? kv_bytes(CudaOptions{}) : host_kv_bytes};
  int64_t pages = o.cache_pages ? *o.cache_pages
                                : cache::KvCache::pages_for_bytes(shape, o.cache_bytes, !use_cuda);
  if (pages < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--cache-bytes ", o.cache_bytes, " holds no page of this model"));
  }
  return cache::KvCache::create(shape, pages, /*host_storage=*/!use_cuda);
}

// The descriptor limit bounds connections on both ports: take all the hard limit allows.
void raise_open_file_limit() {
  rlimit lim{};
  if (::getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur < lim.rlim_max) {
    lim.rlim_cur = lim.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &lim);
  }
}

int milliseconds(double seconds) {
  return static_cast<int>(std::min(seconds * 1000.0, double{std::numeric_limits<int>::max()}));
}

struct GrpcEndpoint {
  std::unique_ptr<grpc::Server> server;
  std::unique_ptr<Acceptor> acceptor;  // the server's only listener
};

absl::StatusOr<GrpcEndpoint> start_grpc(const ServeOptions& o, FpaServiceImpl& service) {
  absl::StatusOr<ListenSocket> socket = listen_tcp(o.address, /*backlog=*/1024);
  if (!socket.ok()) return socket.status();
  GrpcEndpoint g;
  g.acceptor = std::make_unique<Acceptor>(
      *socket, AcceptorLimits{o.max_connections, std::chrono::milliseconds(
                                                     milliseconds(o.handshake_timeout_seconds))});
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  builder.RegisterService(&service);
  builder.SetMaxReceiveMessageSize(4 << 20);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, o.max_streams_per_connection);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_IDLE_MS, milliseconds(o.idle_timeout_seconds));
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, milliseconds(o.keepalive_seconds));
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 20000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  g.server = builder.BuildAndStart();
  if (g.server == nullptr) return absl::UnavailableError("cannot start the gRPC server");
  g.acceptor->start(g.server.get());
  return g;
}

// The prefix cache's share: the flag's, else the default where the backend's forks are proven
// (a default must neither stop a server from starting nor risk a wrong answer).
absl::StatusOr<double> prefix_cache_share(const ServeOptions& o, const ModelConfig& config,
                                          bool use_cuda) {
  // TODO(issue 25): carry the CUDA backend's shift slots with forks, as the CPU backend's rows.
  if (o.prefix_cache && *o.prefix_cache > 0 && use_cuda && (config.k_shift || config.v_shift)) {
    return absl::InvalidArgumentError(
        "--prefix-cache: the model's key/value shift (use_k_shift, use_v_shift) does not work "
        "with the prefix cache on the cuda backend yet; leave it at 0 or use --backend cpu");
  }
  if (o.prefix_cache) return *o.prefix_cache;
  // TODO(issue 23): on by default on CUDA too once the GPU bundle's fork tests have run on a
  // device (so far on an emulated device pool only).
  if (use_cuda) {
    std::cerr << "fpa-serve: prefix cache off by default on the cuda backend (its device forks "
                 "are tested on an emulated device only); --prefix-cache F turns it on\n";
    return 0.0;
  }
  return kDefaultPrefixCacheShare;
}

int serve(const ServeOptions& o) {
  const bool use_cuda = o.backend == "cuda" || (o.backend == "auto" && cuda_device_available());
  absl::StatusOr<LoadedForCpu> loaded = load_model(o, use_cuda);
  if (!loaded.ok()) {
    std::cerr << "fpa-serve: " << loaded.status().message() << "\n";
    return 1;
  }
  const Model& model = *loaded->model;
  const CpuFormats& formats = loaded->formats;
  const ModelConfig& config = model.config();
  const absl::StatusOr<double> prefix_share = prefix_cache_share(o, config, use_cuda);
  if (!prefix_share.ok()) {
    std::cerr << "fpa-serve: " << prefix_share.status().message() << "\n";
    return 1;
  }
  // A chat template that does not parse leaves the model usable without chat.
  if (const ModelChatTemplate* t = model.tokenizer().chat_template(); t && !t->parsed.ok()) {
    std::cerr << "fpa-serve: warning: " << t->parsed.status().message()
              << " (chat requests will be refused)\n";
  }
  absl::StatusOr<std::unique_ptr<cache::KvCache>> kv = make_cache(o, config, use_cuda, formats);
  if (!kv.ok()) {
    std::cerr << "fpa-serve: " << kv.status().message() << "\n";
    return 1;
  }
  absl::StatusOr<std::unique_ptr<Backend>> backend =
      make_backend(o, model, **kv, use_cuda, formats);
  if (!backend.ok()) {
    std::cerr << "fpa-serve: backend: " << backend.status().message() << "\n";
    return 1;
  }
  ModelRunner runner(model, **kv, std::move(*backend));

  const std::string model_name = served_model_name(o);
  ServerMetrics metrics(**kv, model_name, *prefix_share > 0);
  http::Limits http_limits;
  http_limits.on_failure = [&metrics] { metrics.add_http_failure(); };
  absl::StatusOr<std::unique_ptr<http::HttpServer>> metrics_http = http::HttpServer::start(
      o.metrics_address, http_limits, metrics_handler(metrics.collectable()));
  if (!metrics_http.ok()) {
    std::cerr << "fpa-serve: metrics: " << metrics_http.status().message() << "\n";
    return 1;
  }

  Scheduler scheduler(runner,
                      {o.max_batch, o.max_queue, o.prefill_chunk, o.cache_watermark,
                       o.cache_pages ? "--cache-pages" : "--cache-bytes", *prefix_share},
                      &metrics);
  ServiceInfo info;
  info.backend = std::string(runner.backend_name());
  info.formats = formats;
  info.limits = {config.vocab_size, &model.tokenizer(), o.max_prompt_tokens, o.max_new_tokens,
                 o.tau.value_or(config.tau)};
  info.max_batch = o.max_batch;
  FpaServiceImpl service(model, **kv, scheduler, metrics, info);

  OpenAiApi api(
      scheduler, metrics,
      {model_name, info.limits, attention_kind_name(config.attention), o.api_key, formats});
  http::Limits api_limits = http_limits;
  api_limits.max_connections =
      o.http_max_connections.value_or(std::max(1024, o.max_batch + o.max_queue + 64));
  absl::StatusOr<std::unique_ptr<http::HttpServer>> api_http =
      http::HttpServer::start(o.http_address, api_limits, api.handler());
  if (!api_http.ok()) {
    std::cerr << "fpa-serve: http: " << api_http.status().message() << "\n";
    return 1;
  }

  absl::StatusOr<GrpcEndpoint> grpc_endpoint = start_grpc(o, service);
  if (!grpc_endpoint.ok()) {
    std::cerr << "fpa-serve: " << grpc_endpoint.status().message() << "\n";
    return 1;
  }
  grpc::Server* server = grpc_endpoint->server.get();
  const int port = grpc_endpoint->acceptor->port();
  server->GetHealthCheckService()->SetServingStatus(kServiceName, true);
  scheduler.start();

  std::string host = o.address.substr(0, o.address.rfind(':'));
  std::cout << "fpa-serve: " << config.n_layers << "-layer model from " << o.model << " on "
            << runner.backend_name() << ", " << (*kv)->stats().pages_total << " cache pages ("
            << ((*kv)->shape().kv_bytes == 2 ? "bf16" : "float32")
            << " keys and values), prefix cache share " << *prefix_share << " (--prefix-cache)\n";
  if (!use_cuda) {
    std::cout << "fpa-serve: cpu weights " << formats.weights << " (--cpu-weights " << o.cpu_weights
              << "), kv pages " << formats.kv << " (--kv-dtype " << o.kv_dtype << ")\n";
  }
  std::cout << "fpa-serve: listening on " << host << ":" << port << " (gRPC), "
            << o.metrics_address.substr(0, o.metrics_address.rfind(':')) << ":"
            << (*metrics_http)->port() << " (metrics), "
            << o.http_address.substr(0, o.http_address.rfind(':')) << ":" << (*api_http)->port()
            << " (http)" << std::endl;

  sigset_t signals = stop_signals();
  int sig = 0;
  sigwait(&signals, &sig);

  std::cout << "fpa-serve: " << (sig == SIGTERM ? "SIGTERM" : "SIGINT") << ", draining (at most "
            << o.drain_seconds << " s)" << std::endl;
  server->GetHealthCheckService()->SetServingStatus(false);
  api.set_draining();
  scheduler.drain(std::chrono::duration<double>(o.drain_seconds));
  grpc_endpoint->acceptor->stop();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  std::cout << "fpa-serve: stopped" << std::endl;
  return 0;
}

}  // namespace fpa::server

int main(int argc, char** argv) {
  fpa::cpu::restart_for_blas_kernels(argv);
  // Block the stop signals before any thread starts, so that every thread inherits the mask and
  // only sigwait() in serve() sees them.
  sigset_t signals = fpa::server::stop_signals();
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  fpa::server::raise_open_file_limit();

  absl::StatusOr<fpa::server::ServeOptions> options = fpa::server::parse_options(argc, argv);
  if (!options.ok()) {
    std::cerr << "fpa-serve: " << options.status().message() << "\n";
    return 2;
  }
  if (options->help) {
    std::cout << fpa::server::usage();
    return 0;
  }
  return fpa::server::serve(*options);
}
