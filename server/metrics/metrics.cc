#include "server/metrics/metrics.h"

#include <algorithm>
#include <map>
#include <vector>

#include "absl/status/status.h"

namespace fpa::server {
namespace {

using prometheus::BuildCounter;
using prometheus::BuildGauge;
using prometheus::BuildHistogram;
using prometheus::Histogram;
using prometheus::Registry;

using Labels = std::map<std::string, std::string>;

// vLLM (>= 0.10) labels every series with its engine's index; fpa-serve runs one engine.
constexpr const char* kVllmEngine = "0";

Labels vllm_labels(const std::string& model_name) {
  return {{"model_name", model_name}, {"engine", kVllmEngine}};
}

prometheus::Gauge& gauge(Registry& r, const std::string& name, const std::string& help,
                         const Labels& labels = {}) {
  return BuildGauge().Name(name).Help(help).Register(r).Add(labels);
}

prometheus::Counter& counter(Registry& r, const std::string& name, const std::string& help,
                             const Labels& labels = {}) {
  return BuildCounter().Name(name).Help(help).Register(r).Add(labels);
}

Histogram& histogram(Registry& r, const std::string& name, const std::string& help,
                     Histogram::BucketBoundaries buckets, const Labels& labels = {}) {
  return BuildHistogram().Name(name).Help(help).Register(r).Add(labels, std::move(buckets));
}

// Latency buckets of the fpa_* histograms: 0.5 ms to 60 s.
Histogram::BucketBoundaries latency_buckets() {
  return {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
}

// vLLM's own boundaries for its names, so that dashboards built for vLLM read the same buckets
// (https://github.com/vllm-project/vllm/blob/main/vllm/v1/metrics/loggers.py): time to first
// token, then per output token, then whole requests.
Histogram::BucketBoundaries vllm_ttft_buckets() {
  return {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,  0.25,  0.5,   0.75,
          1.0,   2.5,   5.0,  7.5,  10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0};
}
Histogram::BucketBoundaries vllm_token_latency_buckets() {
  return {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2,  0.3,  0.4, 0.5,
          0.75, 1.0,   2.5,  5.0,   7.5, 10.0, 20.0, 40.0, 80.0};
}
Histogram::BucketBoundaries vllm_request_buckets() {
  return {0.3,  0.5,  0.8,  1.0,  1.5,   2.0,   2.5,   5.0,   10.0,   15.0,  20.0,
          30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};
}

// One figure into an fpa_* metric and its vLLM twins.
template <typename... M>
void set_all(double v, M&... m) {
  (m.Set(v), ...);
}
template <typename... M>
void observe_all(double v, M&... m) {
  (m.Observe(v), ...);
}
template <typename... M>
void increment_all(double v, M&... m) {
  (m.Increment(v), ...);
}

// Token counts as vLLM buckets them: 1, 2, 5, 10, 20, 50, ... up to the longest prompt.
Histogram::BucketBoundaries token_buckets() {
  Histogram::BucketBoundaries b;
  for (double scale = 1; scale <= 65536; scale *= 10) {
    for (double m : {1.0, 2.0, 5.0}) b.push_back(m * scale);
  }
  return b;
}

class RefreshingCollectable : public prometheus::Collectable {
 public:
  RefreshingCollectable(ServerMetrics& metrics, std::shared_ptr<Registry> registry)
      : metrics_(metrics), registry_(std::move(registry)) {}
  std::vector<prometheus::MetricFamily> Collect() const override {
    metrics_.refresh_cache_gauges();
    return registry_->Collect();
  }

 private:
  ServerMetrics& metrics_;
  std::shared_ptr<Registry> registry_;
};

}  // namespace

// Two of vLLM's names are older spellings its published Grafana dashboard still queries
// (gpu_cache_usage_perc, time_per_output_token_seconds); they carry the same values.
struct ServerMetrics::Vllm {
  Vllm(Registry& r, const Labels& l)
      : kv_usage(gauge(r, "vllm:kv_cache_usage_perc", "KV pages in use / pages total (0-1)", l)),
        gpu_cache_usage(
            gauge(r, "vllm:gpu_cache_usage_perc", "Older name of vllm:kv_cache_usage_perc", l)),
        running(gauge(r, "vllm:num_requests_running", "Sequences in the running batch", l)),
        waiting(gauge(r, "vllm:num_requests_waiting", "Requests queued", l)),
        prompt_tokens(counter(r, "vllm:prompt_tokens_total", "Prompt tokens processed", l)),
        generation_tokens(counter(r, "vllm:generation_tokens_total", "Tokens generated", l)),
        preemptions(counter(r, "vllm:num_preemptions_total",
                            "Running requests preempted to free KV cache pages", l)),
        ttft(histogram(r, "vllm:time_to_first_token_seconds",
                       "Request arrival to first generated token", vllm_ttft_buckets(), l)),
        itl(histogram(r, "vllm:inter_token_latency_seconds", "Between consecutive generated tokens",
                      vllm_token_latency_buckets(), l)),
        tpot(histogram(r, "vllm:time_per_output_token_seconds",
                       "Older name of vllm:inter_token_latency_seconds",
                       vllm_token_latency_buckets(), l)),
        e2e(histogram(r, "vllm:e2e_request_latency_seconds", "Request arrival to last token",
                      vllm_request_buckets(), l)),
        prompt_len(histogram(r, "vllm:request_prompt_tokens", "Prompt tokens of a finished request",
                             token_buckets(), l)),
        generation_len(histogram(r, "vllm:request_generation_tokens",
                                 "Generated tokens of a finished request", token_buckets(), l)),
        max_generation(histogram(r, "vllm:request_max_num_generation_tokens",
                                 "max_new_tokens of a finished request", token_buckets(), l)),
        success(BuildCounter()
                    .Name("vllm:request_success_total")
                    .Help("Finished requests by finish reason (abort: failed or cancelled)")
                    .Register(r)),
        queue(histogram(r, "vllm:request_queue_time_seconds", "Arrival to first admission",
                        vllm_request_buckets(), l)),
        prefill(histogram(r, "vllm:request_prefill_time_seconds", "First admission to first token",
                          vllm_request_buckets(), l)),
        decode(histogram(r, "vllm:request_decode_time_seconds", "First token to last token",
                         vllm_request_buckets(), l)),
        labels(l) {}

  prometheus::Gauge& kv_usage;
  prometheus::Gauge& gpu_cache_usage;
  prometheus::Gauge& running;
  prometheus::Gauge& waiting;
  prometheus::Counter& prompt_tokens;
  prometheus::Counter& generation_tokens;
  prometheus::Counter& preemptions;
  Histogram& ttft;
  Histogram& itl;
  Histogram& tpot;
  Histogram& e2e;
  Histogram& prompt_len;
  Histogram& generation_len;
  Histogram& max_generation;
  prometheus::Family<prometheus::Counter>& success;
  Histogram& queue;
  Histogram& prefill;
  Histogram& decode;
  const Labels labels;
};

// The prefix cache's series, refreshed from its stats at scrape time (counters by their growth).
struct ServerMetrics::Prefix {
  Prefix(Registry& r, const Labels& l)
      : snapshots(gauge(r, "fpa_prefix_cache_snapshots", "Cached prefix states held", {})),
        bytes(gauge(r, "fpa_prefix_cache_bytes", "Bytes of the pages cached prefixes hold", {})),
        queried(counter(r, "fpa_prefix_cache_queried_tokens_total",
                        "Prompt tokens looked up in the prefix cache", {})),
        hits(counter(r, "fpa_prefix_cache_hit_tokens_total",
                     "Prompt tokens the prefix cache held (not prefilled)", {})),
        evictions(
            counter(r, "fpa_prefix_cache_evictions_total", "Cached prefixes dropped for room", {})),
        vllm_queries(counter(r, "vllm:prefix_cache_queries_total",
                             "Prompt tokens looked up in the prefix cache", l)),
        vllm_hits(counter(r, "vllm:prefix_cache_hits_total",
                          "Prompt tokens found in the prefix cache", l)) {}

  void refresh(const cache::PrefixCacheStats& st, int64_t bytes_per_page) {
    snapshots.Set(static_cast<double>(st.snapshots));
    bytes.Set(static_cast<double>(st.pages * bytes_per_page));
    increment_all(static_cast<double>(st.queried_tokens - seen.queried_tokens), queried,
                  vllm_queries);
    increment_all(static_cast<double>(st.hit_tokens - seen.hit_tokens), hits, vllm_hits);
    evictions.Increment(static_cast<double>(st.evictions - seen.evictions));
    seen = st;
  }

  const cache::PrefixCache* watched = nullptr;
  cache::PrefixCacheStats seen;
  prometheus::Gauge& snapshots;
  prometheus::Gauge& bytes;
  prometheus::Counter& queried;
  prometheus::Counter& hits;
  prometheus::Counter& evictions;
  prometheus::Counter& vllm_queries;
  prometheus::Counter& vllm_hits;
};

ServerMetrics::~ServerMetrics() = default;

void ServerMetrics::watch_prefix_cache(const cache::PrefixCache* prefixes) {
  std::lock_guard lock(evicted_mu_);
  prefix_->watched = prefixes;
}

// vLLM's cache_config_info: a gauge at 1 whose labels describe the KV cache (vLLM's names; a
// block is a page). The cache dtype is the stored one, where vLLM says "auto" for the model's.
void publish_cache_config(Registry& r, const cache::KvCache& cache, bool prefix_caching) {
  const cache::CacheShape& shape = cache.shape();
  gauge(r, "vllm:cache_config_info", "Information of the KV cache configuration",
        {{"engine", kVllmEngine},
         {"block_size", std::to_string(shape.page_slots)},
         {"num_gpu_blocks", std::to_string(cache.stats().pages_total)},
         {"num_cpu_blocks", "None"},
         {"cache_dtype", shape.kv_bytes == 2 ? "bfloat16" : "float32"},
         {"enable_prefix_caching", prefix_caching ? "True" : "False"}})
      .Set(1);
}

ServerMetrics::ServerMetrics(const cache::KvCache& cache, const std::string& model_name,
                             bool prefix_caching)
    : cache_(cache),
      pages_total_(gauge(*registry_, "fpa_cache_pages", "Pages in the KV pool")),
      // TODO(issue 24): drop the old name (a gauge ending in _total) after one release.
      pages_total_alias_(gauge(*registry_, "fpa_cache_pages_total",
                               "Deprecated: fpa_cache_pages (a gauge, not a counter)")),
      pages_in_use_(gauge(*registry_, "fpa_cache_pages_in_use",
                          "Pages the running sequences hold (cached prefixes not counted)")),
      live_keys_(gauge(*registry_, "fpa_cache_live_keys",
                       "Live keys of the running sequences, all layers and heads (cached prefixes "
                       "not counted)")),
      keys_evicted_(counter(*registry_, "fpa_cache_keys_evicted_total", "Keys evicted")),
      bytes_held_(
          gauge(*registry_, "fpa_cache_bytes_held",
                "Bytes of the pages the running sequences hold (cached prefixes not counted)")),
      bytes_full_(gauge(*registry_, "fpa_cache_bytes_full",
                        "Bytes a never-evicting cache would hold for the running sequences "
                        "(cached prefixes not counted)")),
      bytes_saved_(gauge(*registry_, "fpa_cache_bytes_saved",
                         "bytes_full - the bytes the running sequences hold")),
      live_fraction_(histogram(
          *registry_, "fpa_request_live_fraction",
          "Per finished request: live keys / full-cache keys at its end",
          {0.01, 0.02, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0})),
      running_(gauge(*registry_, "fpa_requests_running", "Sequences in the running batch")),
      waiting_(gauge(*registry_, "fpa_requests_waiting", "Requests queued")),
      requests_(BuildCounter()
                    .Name("fpa_requests_total")
                    .Help("Finished requests by gRPC status code name")
                    .Register(*registry_)),
      ttft_(histogram(*registry_, "fpa_time_to_first_token_seconds",
                      "Request arrival to first generated token", latency_buckets())),
      itl_(histogram(*registry_, "fpa_inter_token_latency_seconds",
                     "Between consecutive generated tokens", latency_buckets())),
      duration_(histogram(*registry_, "fpa_request_duration_seconds",
                          "Request arrival to last token", latency_buckets())),
      prompt_tokens_(counter(*registry_, "fpa_prompt_tokens_total", "Prompt tokens processed")),
      generated_tokens_(counter(*registry_, "fpa_generated_tokens_total", "Tokens generated")),
      preemptions_(counter(*registry_, "fpa_preemptions_total",
                           "Running requests preempted to free KV cache pages")),
      recomputed_tokens_(counter(*registry_, "fpa_recomputed_tokens_total",
                                 "Tokens prefilled again after preemptions")),
      http_failures_(counter(*registry_, "fpa_http_connection_failures_total",
                             "HTTP connections closed because handling them threw")),
      vllm_(std::make_unique<Vllm>(*registry_, vllm_labels(model_name))),
      prefix_(std::make_unique<Prefix>(*registry_, vllm_labels(model_name))) {
  publish_cache_config(*registry_, cache, prefix_caching);
  collectable_ = std::make_shared<RefreshingCollectable>(*this, registry_);
  refresh_cache_gauges();
}

void ServerMetrics::set_queue(int running, int waiting) {
  set_all(running, running_, vllm_->running);
  set_all(waiting, waiting_, vllm_->waiting);
}

void ServerMetrics::observe_ttft(double seconds) { observe_all(seconds, ttft_, vllm_->ttft); }

void ServerMetrics::observe_inter_token(double seconds) {
  observe_all(seconds, itl_, vllm_->itl, vllm_->tpot);
}

void ServerMetrics::add_preemption() { increment_all(1, preemptions_, vllm_->preemptions); }

void ServerMetrics::count_aborted() {
  Labels labels = vllm_->labels;
  labels["finished_reason"] = "abort";
  vllm_->success.Add(labels).Increment();
}

void ServerMetrics::observe_finished(const FinishedRequest& r) {
  observe_all(r.e2e_seconds, duration_, vllm_->e2e);
  Vllm& v = *vllm_;
  v.prompt_len.Observe(static_cast<double>(r.prompt_tokens));
  v.generation_len.Observe(static_cast<double>(r.generated_tokens));
  v.max_generation.Observe(static_cast<double>(r.max_new_tokens));
  Labels labels = v.labels;
  labels["finished_reason"] = r.finished_reason;
  v.success.Add(labels).Increment();
  v.queue.Observe(r.queue_seconds);
  v.prefill.Observe(r.prefill_seconds);
  v.decode.Observe(r.decode_seconds);
}

void ServerMetrics::add_prompt_tokens(int64_t n) {
  increment_all(static_cast<double>(n), prompt_tokens_, vllm_->prompt_tokens);
}

void ServerMetrics::add_generated_tokens(int64_t n) {
  increment_all(static_cast<double>(n), generated_tokens_, vllm_->generation_tokens);
}

void ServerMetrics::count_request(int grpc_code) {
  requests_.Add({{"code", absl::StatusCodeToString(static_cast<absl::StatusCode>(grpc_code))}})
      .Increment();
}

void ServerMetrics::refresh_cache_gauges() {
  std::lock_guard lock(evicted_mu_);
  // The running sequences' figures: cached prefixes are reclaimable, so their pages are not in
  // use (fpa_prefix_cache_bytes shows them), as vLLM counts its usage: a router then does not
  // steer away from a warm pod.
  const auto [s, cached] = cache::held_stats(cache_, prefix_->watched);
  if (prefix_->watched != nullptr) prefix_->refresh(cached, s.page_slots * s.bytes_per_key);
  set_all(static_cast<double>(s.pages_total), pages_total_, pages_total_alias_);
  pages_in_use_.Set(static_cast<double>(s.pages_in_use));
  double usage = s.pages_total > 0
                     ? static_cast<double>(s.pages_in_use) / static_cast<double>(s.pages_total)
                     : 0.0;
  set_all(usage, vllm_->kv_usage, vllm_->gpu_cache_usage);
  live_keys_.Set(static_cast<double>(s.live_slots));
  bytes_held_.Set(static_cast<double>(s.bytes_held()));
  bytes_full_.Set(static_cast<double>(s.bytes_full()));
  bytes_saved_.Set(static_cast<double>(s.bytes_full() - s.bytes_held()));
  if (s.evicted_slots > evicted_seen_) {
    keys_evicted_.Increment(static_cast<double>(s.evicted_slots - evicted_seen_));
    evicted_seen_ = s.evicted_slots;
  }
}

}  // namespace fpa::server
