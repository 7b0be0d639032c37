// The Prometheus metrics of docs/serving.md. Cache figures are read from KvCache::stats() at
// scrape time; request figures are recorded by the scheduler and the front ends as they happen.
// Each shared concept is exported twice, under its fpa_* name and under vLLM's name with a
// model_name label, from the same observation, so that vLLM's dashboards and KV-aware routers
// read fpa-serve unchanged.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "cache/kv_cache.h"
#include "cache/prefix_cache.h"
#include "prometheus/collectable.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace fpa::server {

// A request that finished with OK, for the per-request series.
struct FinishedRequest {
  double e2e_seconds = 0;      // arrival to last token
  double queue_seconds = 0;    // arrival to first admission
  double prefill_seconds = 0;  // first admission to first token
  double decode_seconds = 0;   // first token to last token
  int64_t prompt_tokens = 0;
  int64_t generated_tokens = 0;
  int64_t max_new_tokens = 0;
  std::string finished_reason;  // vLLM's: "stop" (EOS or a stop sequence) or "length"
};

class ServerMetrics {
 public:
  // `model_name` labels the vllm:* series (the served model's name, as /v1/models lists it);
  // `prefix_caching` is reported in vllm:cache_config_info.
  ServerMetrics(const cache::KvCache& cache, const std::string& model_name,
                bool prefix_caching = false);
  ~ServerMetrics();

  // What an Exposer serves: refreshes the cache gauges, then collects everything.
  std::shared_ptr<prometheus::Collectable> collectable() { return collectable_; }

  void set_queue(int running, int waiting);
  void count_request(int grpc_code);
  void observe_ttft(double seconds);
  void observe_inter_token(double seconds);
  void observe_finished(const FinishedRequest& r);
  void observe_live_fraction(double f) { live_fraction_.Observe(f); }
  void add_prompt_tokens(int64_t n);
  void add_generated_tokens(int64_t n);
  void add_preemption();
  // A request the scheduler ended with an error or a cancellation (vLLM's "abort").
  void count_aborted();
  void add_recomputed_tokens(int64_t n) { recomputed_tokens_.Increment(static_cast<double>(n)); }
  void add_http_failure() { http_failures_.Increment(); }

  // The prefix cache's figures are read at scrape time from `prefixes` (null: off, and no read
  // of the last one is under way when this returns: its owner unwatches it before it goes).
  void watch_prefix_cache(const cache::PrefixCache* prefixes);

  void refresh_cache_gauges();

 private:
  const cache::KvCache& cache_;
  std::shared_ptr<prometheus::Registry> registry_ = std::make_shared<prometheus::Registry>();
  std::shared_ptr<prometheus::Collectable> collectable_;

  prometheus::Gauge& pages_total_;
  prometheus::Gauge& pages_total_alias_;
  prometheus::Gauge& pages_in_use_;
  prometheus::Gauge& live_keys_;
  prometheus::Counter& keys_evicted_;
  prometheus::Gauge& bytes_held_;
  prometheus::Gauge& bytes_full_;
  prometheus::Gauge& bytes_saved_;
  prometheus::Histogram& live_fraction_;
  prometheus::Gauge& running_;
  prometheus::Gauge& waiting_;
  prometheus::Family<prometheus::Counter>& requests_;
  prometheus::Histogram& ttft_;
  prometheus::Histogram& itl_;
  prometheus::Histogram& duration_;
  prometheus::Counter& prompt_tokens_;
  prometheus::Counter& generated_tokens_;
  prometheus::Counter& preemptions_;
  prometheus::Counter& recomputed_tokens_;
  prometheus::Counter& http_failures_;

  // vLLM's names for the same figures (docs/serving.md has the mapping).
  struct Vllm;
  std::unique_ptr<Vllm> vllm_;
  struct Prefix;
  std::unique_ptr<Prefix> prefix_;

  std::mutex evicted_mu_;     // guards the figures refreshed at scrape time
  int64_t evicted_seen_ = 0;  // the cache's evicted count already added to keys_evicted_
};

}  // namespace fpa::server
