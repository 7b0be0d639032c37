// The scheduler under memory pressure, over the real runner, CPU backend and paged cache:
// preempted requests continue exactly where they stopped, requests too large for the pool are
// refused instead of hanging, and a storm of preemptions and cancellations leaves no page behind.
#include "server/scheduler/scheduler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cache/eviction.h"
#include "server/engine/model_runner.h"

namespace fpa::server {
namespace {

// Collects what the scheduler reports for one request.
class Collect : public RequestSink {
 public:
  void on_tokens(TokenChunk chunk) override {
    std::lock_guard lock(mu_);
    tokens_.insert(tokens_.end(), chunk.ids.begin(), chunk.ids.end());
  }
  void on_finish(Completion done) override {
    std::lock_guard lock(mu_);
    done_ = std::move(done);
    finished_ = true;
    cv_.notify_all();
  }
  const Completion& wait() {
    std::unique_lock lock(mu_);
    EXPECT_TRUE(cv_.wait_for(lock, std::chrono::seconds(120), [&] { return finished_; }))
        << "the request never finished";
    return done_;
  }
  std::vector<int32_t> tokens() {
    std::lock_guard lock(mu_);
    return tokens_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<int32_t> tokens_;
  Completion done_;
  bool finished_ = false;
};

struct Job {
  std::shared_ptr<Request> request = std::make_shared<Request>();
  Collect sink;
};

class SchedulerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto model = Model::load(std::string(FPA_VECTORS_DIR) + "/fpa_free");
    ASSERT_TRUE(model.ok()) << model.status();
    model_ = *std::move(model);
  }

  // A server of `pages` pages of 16 slots.
  void serve(int64_t pages, SchedulerOptions options = {}) {
    scheduler_.reset();
    runner_.reset();
    const ModelConfig& c = model_->config();
    auto cache = cache::KvCache::create({c.n_layers, c.n_heads, c.head_dim, 16}, pages);
    ASSERT_TRUE(cache.ok()) << cache.status();
    cache_ = *std::move(cache);
    auto backend = make_cpu_backend(*model_, *cache_, 1);
    ASSERT_TRUE(backend.ok()) << backend.status();
    runner_ = std::make_unique<ModelRunner>(*model_, *cache_, *std::move(backend));
    options.pool_flag = "--cache-pages";
    scheduler_ = std::make_unique<Scheduler>(*runner_, options, nullptr);
  }

  static std::vector<int32_t> prompt(int n, int salt) {
    std::vector<int32_t> p(n);
    for (int i = 0; i < n; ++i) p[i] = (i * 29 + salt * 13) % 256;
    p[0] = 256;
    return p;
  }

  static GenerationParams params(std::vector<int32_t> p, int new_tokens, cache::Policy policy,
                                 float temperature = 0.0f, uint64_t seed = 0) {
    GenerationParams g;
    g.prompt = std::move(p);
    g.max_new_tokens = new_tokens;
    g.sampling.temperature = temperature;
    g.sampling.seed = seed;
    g.policy.policy = policy;
    g.policy.tau = 3.5f;
    g.policy.budget_fraction = 0.5f;
    return g;
  }

  absl::Status submit(Job& job, GenerationParams p) {
    job.request->params = std::move(p);
    job.request->sink = &job.sink;
    return scheduler_->submit(job.request);
  }

  // The same generation alone, on a pool that never runs short.
  std::vector<int32_t> solo(const GenerationParams& p, int chunk) {
    const ModelConfig& c = model_->config();
    auto cache = cache::KvCache::create({c.n_layers, c.n_heads, c.head_dim, 16}, 8192);
    auto backend = make_cpu_backend(*model_, **cache, 1);
    ModelRunner runner(*model_, **cache, *std::move(backend));
    auto out = runner.generate(p.prompt, p.sampling, p.max_new_tokens, p.policy, chunk);
    EXPECT_TRUE(out.ok()) << out.status();
    return out.ok() ? *out : std::vector<int32_t>{};
  }

  void expect_empty() {
    scheduler_->drain(std::chrono::seconds(60));
    const cache::CacheStats s = cache_->stats();
    EXPECT_EQ(s.pages_in_use, 0);
    EXPECT_EQ(s.pages_reserved, 0);
    EXPECT_EQ(s.sequences, 0);
    EXPECT_EQ(s.live_slots, 0);
    EXPECT_EQ(scheduler_->running(), 0);
    EXPECT_EQ(scheduler_->waiting(), 0);
  }

  void next_turn_equals_a_cold_run(cache::Policy policy, float temperature, bool evicts);

  std::unique_ptr<Model> model_;
  std::unique_ptr<cache::KvCache> cache_;
  std::unique_ptr<ModelRunner> runner_;
  std::unique_ptr<Scheduler> scheduler_;
};

// Two requests that keep every key and fit the pool one at a time but not together: the younger
// is preempted once, when the older grows into its pages, and recomputed (16-token chunks, as
// the solo run prefills) when what it held fits again. Readmitted as soon as its next step fit,
// it regrew into the same shortage: 15 preemptions and 1,280 tokens recomputed for 150. They run
// under fpa with a tau no key reaches, so that admission cannot foresee their need (under `none` it
// would, and keep the younger waiting). Both are queued before the scheduler starts, so the
// batches, and with them the float rounding, are the same on every run.
TEST_F(SchedulerTest, PreemptedRequestsEqualTheirSoloRuns) {
  // 8 streams; alone the older needs 14 pages a stream and the younger 11, of 17.5.
  for (const float temperature : {0.0f, 0.9f}) {
    serve(140, {.prefill_chunk = 16});
    Job older, younger;
    GenerationParams a = params(prompt(20, 1), 200, cache::Policy::kFpa, temperature, 7);
    GenerationParams b = params(prompt(20, 2), 150, cache::Policy::kFpa, temperature, 8);
    a.policy.tau = b.policy.tau = 1e6f;
    ASSERT_TRUE(submit(older, a).ok());
    ASSERT_TRUE(submit(younger, b).ok());
    scheduler_->start();
    const Completion& done_b = younger.sink.wait();
    const Completion& done_a = older.sink.wait();
    ASSERT_TRUE(done_a.status.ok()) << done_a.status;
    ASSERT_TRUE(done_b.status.ok()) << done_b.status;
    EXPECT_EQ(done_a.usage.preemptions, 0);
    EXPECT_EQ(done_b.usage.preemptions, 1) << "temperature " << temperature;
    EXPECT_GT(done_b.usage.recomputed_tokens, 20);
    EXPECT_LE(done_b.usage.recomputed_tokens, 20 + 150) << "at most its whole length, once";
    const std::vector<int32_t> got_a = older.sink.tokens(), want_a = solo(a, 16);
    const std::vector<int32_t> got_b = younger.sink.tokens(), want_b = solo(b, 16);
    auto first_diff = [](const std::vector<int32_t>& x, const std::vector<int32_t>& y) {
      return std::mismatch(x.begin(), x.end(), y.begin(), y.end()).first - x.begin();
    };
    EXPECT_EQ(got_a, want_a) << "temperature " << temperature << " first difference at "
                             << first_diff(got_a, want_a);
    EXPECT_EQ(got_b, want_b) << "temperature " << temperature << " first difference at "
                             << first_diff(got_b, want_b);
    expect_empty();
  }
}

// The same scenario under every policy with evictions happening (tau 2, half budgets, a pool
// the four outgrow together), with and without the prefix cache (whose prompt snapshot a resume
// may take): a resume replays generated tokens one at a time where the kernels would attend over
// keys decode had evicted, so every policy's output equals its solo run. With chunked replay,
// window, sinks, h2o, tova and snapkv all left their solo runs here.
TEST_F(SchedulerTest, PreemptedRequestsEqualTheirSoloRunsUnderEveryPolicy) {
  for (const cache::Policy policy :
       {cache::Policy::kFpa, cache::Policy::kWindow, cache::Policy::kSinks, cache::Policy::kH2O,
        cache::Policy::kTova, cache::Policy::kSnapKV}) {
    for (const double share : {0.0, 0.25}) {
      for (const float temperature : {0.0f, 0.9f}) {
        const std::string what =
            absl::StrCat(std::string(cache::policy_name(policy)), " prefix share ", share,
                         " temperature ", temperature);
        serve(policy == cache::Policy::kFpa ? 56 : 64,
              {.prefill_chunk = 16, .prefix_cache_share = share});
        std::vector<Job> jobs(4);
        std::vector<GenerationParams> ps;
        for (int i = 0; i < 4; ++i) {
          ps.push_back(params(prompt(40, i + 1), 200, policy, temperature, 7 + i));
          ps.back().policy.tau = 2.0f;
          ps.back().policy.prompt_tokens = 40;  // as validation sets it (snapkv)
          ASSERT_TRUE(submit(jobs[i], ps.back()).ok());
        }
        scheduler_->start();
        int preemptions = 0;
        for (int i = 0; i < 4; ++i) {
          const Completion& done = jobs[i].sink.wait();
          ASSERT_TRUE(done.status.ok()) << what << ": " << done.status;
          EXPECT_LT(done.usage.live_fraction, 1.0) << what << ": nothing was evicted";
          preemptions += done.usage.preemptions;
          EXPECT_EQ(jobs[i].sink.tokens(), solo(ps[i], 16)) << what << ", request " << i;
        }
        EXPECT_GE(preemptions, 1) << what;
        expect_empty();
      }
    }
  }
}

TEST_F(SchedulerTest, RequestLargerThanThePoolIsRefusedAtOnce) {
  serve(40);  // 5 pages a stream: 80 keys
  scheduler_->start();
  Job none;
  const absl::Status st = submit(none, params(prompt(30, 3), 60, cache::Policy::kNone));
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted) << st;
  EXPECT_NE(st.message().find("--cache-pages"), std::string_view::npos) << st;
  // Under fpa the need shows only as it runs: a tau that never evicts fails once the request
  // outgrows the pool alone, without hanging and without taking anything else down.
  Job never_evicts, small;
  GenerationParams big = params(prompt(30, 4), 200, cache::Policy::kFpa);
  big.policy.tau = 1e30f;
  ASSERT_TRUE(submit(never_evicts, big).ok());
  const Completion& failed = never_evicts.sink.wait();
  EXPECT_EQ(failed.status.code(), absl::StatusCode::kResourceExhausted) << failed.status;
  ASSERT_TRUE(submit(small, params(prompt(10, 5), 20, cache::Policy::kNone)).ok());
  EXPECT_TRUE(small.sink.wait().status.ok());
  expect_empty();
}

// Many requests of every policy in a pool that holds a few at a time, with random
// cancellations: each ends with a status, and the pool is empty afterwards.
TEST_F(SchedulerTest, StormOfPreemptionsAndCancellationsLeavesNoPage) {
  serve(96, {.max_batch = 16});
  scheduler_->start();
  const cache::Policy policies[] = {cache::Policy::kFpa, cache::Policy::kNone,
                                    cache::Policy::kWindow, cache::Policy::kSinks,
                                    cache::Policy::kH2O};
  std::mt19937 rng(3);
  std::vector<std::unique_ptr<Job>> jobs;
  for (int i = 0; i < 40; ++i) {
    auto job = std::make_unique<Job>();
    const int len = std::uniform_int_distribution<int>(5, 120)(rng);
    const int new_tokens = std::uniform_int_distribution<int>(1, 60)(rng);
    GenerationParams p =
        params(prompt(len, i), new_tokens, policies[i % 5], i % 2 ? 0.7f : 0.0f, i);
    const absl::Status st = submit(*job, std::move(p));
    ASSERT_TRUE(st.ok() || absl::IsResourceExhausted(st)) << st;
    if (!st.ok()) continue;
    if (i % 3 == 0) job->request->cancel();  // while it waits
    jobs.push_back(std::move(job));
  }
  for (size_t i = 1; i < jobs.size(); i += 3) {  // while it runs, or after it finished
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    jobs[i]->request->cancel();
  }
  int ok = 0, cancelled = 0;
  for (auto& job : jobs) {
    const Completion& c = job->sink.wait();
    ok += c.status.ok();
    cancelled += absl::IsCancelled(c.status);
    EXPECT_TRUE(c.status.ok() || absl::IsCancelled(c.status)) << c.status;
  }
  EXPECT_GT(ok, 0);
  EXPECT_GT(cancelled, 0);
  expect_empty();
}

// Counts the requests that finished, whatever their status.
class CountFinished : public RequestSink {
 public:
  explicit CountFinished(std::atomic<int>& finished) : finished_(finished) {}
  void on_tokens(TokenChunk) override {}
  void on_finish(Completion) override { finished_.fetch_add(1); }

 private:
  std::atomic<int>& finished_;
};

// Submissions as fast as they are refused, against short requests the loop keeps admitting: the
// requests accepted and not yet finished never exceed --max-batch + --max-queue, including while
// one is between the queue and the batch (once counted in neither, so a fourth was accepted).
TEST_F(SchedulerTest, QueueLimitHoldsWhileRequestsAreAdmitted) {
  serve(4096, {.max_batch = 1, .max_queue = 2});
  scheduler_->start();
  std::atomic<int> finished{0};
  CountFinished sink(finished);
  std::vector<std::shared_ptr<Request>> accepted;
  int refused = 0, worst = 0;
  for (int i = 0; accepted.size() < 3000 && i < 20000000; ++i) {
    auto r = std::make_shared<Request>();
    r->params = params(prompt(8, i), 1, cache::Policy::kNone);
    r->sink = &sink;
    const absl::Status st = scheduler_->submit(r);
    if (!st.ok()) {
      ASSERT_TRUE(absl::IsResourceExhausted(st)) << st;
      ++refused;
      continue;
    }
    accepted.push_back(std::move(r));
    worst = std::max(worst, static_cast<int>(accepted.size()) - finished.load());
  }
  EXPECT_EQ(accepted.size(), 3000u);
  EXPECT_GT(refused, 0);
  EXPECT_LE(worst, 3) << "requests accepted and unfinished at once, for a limit of 1 + 2";
  expect_empty();
}

// A client's cancellation at its own deadline reaches the server a transit time before the
// server's deadline: it is reported as the deadline it was, while an early one stays a cancel.
TEST_F(SchedulerTest, CancellationAtTheDeadlineIsDeadlineExceeded) {
  serve(4096);
  scheduler_->start();
  Job early, at_deadline;
  early.request->deadline = Clock::now() + std::chrono::seconds(60);
  at_deadline.request->deadline = Clock::now() + std::chrono::milliseconds(50);
  for (Job* job : {&early, &at_deadline}) {
    ASSERT_TRUE(submit(*job, params(prompt(40, 1), 2000, cache::Policy::kFpa)).ok());
    job->request->cancel();
  }
  EXPECT_TRUE(absl::IsCancelled(early.sink.wait().status)) << early.sink.wait().status;
  EXPECT_TRUE(absl::IsDeadlineExceeded(at_deadline.sink.wait().status))
      << at_deadline.sink.wait().status;
  expect_empty();
}

// A conversation's second turn starts from the first turn's cached state and gives the tokens a
// cold run of the whole prompt gives. `evicts`: the first turn must have evicted keys.
void SchedulerTest::next_turn_equals_a_cold_run(cache::Policy policy, float temperature,
                                                bool evicts) {
  const std::string what =
      absl::StrCat(std::string(cache::policy_name(policy)), " temperature ", temperature);
  serve(4096, {.prefill_chunk = 16, .prefix_cache_share = 0.5});
  scheduler_->start();
  // tau 2 and half budgets: every rule but none evicts within the first turn.
  auto turn = [&](std::vector<int32_t> tokens, int new_tokens, uint64_t seed) {
    GenerationParams g = params(std::move(tokens), new_tokens, policy, temperature, seed);
    g.policy.tau = 2.0f;
    g.policy.prompt_tokens = static_cast<int64_t>(g.prompt.size());  // as validation sets it
    return g;
  };
  Job first;
  ASSERT_TRUE(submit(first, turn(prompt(37, 1), 25, 3)).ok());
  const Completion& first_done = first.sink.wait();
  ASSERT_TRUE(first_done.status.ok()) << what << ": " << first_done.status;
  if (evicts) {
    EXPECT_LT(first_done.usage.live_fraction, 1.0) << what << ": nothing was evicted";
  }
  std::vector<int32_t> next = prompt(37, 1);
  for (int32_t tok : first.sink.tokens()) next.push_back(tok);
  for (int32_t tok : prompt(21, 2)) next.push_back(tok % 256);
  const GenerationParams p = turn(next, 30, 4);
  Job second;
  ASSERT_TRUE(submit(second, p).ok());
  const Completion& done = second.sink.wait();
  ASSERT_TRUE(done.status.ok()) << what << ": " << done.status;
  // The first turn's prompt and output but its last token were cached at its end.
  // Under the heuristics a state depends on the chunks that built it: no hit across requests.
  const bool replays = cache::chunks_replay_decode(p.policy);
  EXPECT_EQ(done.usage.cached_tokens,
            replays ? 37 + static_cast<int64_t>(first.sink.tokens().size()) - 1 : 0)
      << what;
  EXPECT_EQ(second.sink.tokens(), solo(p, 16)) << what;
  const cache::PrefixCacheStats st = scheduler_->prefix_cache()->stats();
  EXPECT_GT(st.snapshots, 0) << what;
  EXPECT_EQ(st.hit_tokens, done.usage.cached_tokens);
  expect_empty();  // draining flushes the snapshots
}

TEST_F(SchedulerTest, PrefixCacheHitEqualsAColdRun) {
  for (const cache::Policy policy :
       {cache::Policy::kFpa, cache::Policy::kNone, cache::Policy::kWindow, cache::Policy::kSinks,
        cache::Policy::kH2O, cache::Policy::kTova, cache::Policy::kSnapKV}) {
    for (const float temperature : {0.0f, 0.9f}) {
      next_turn_equals_a_cold_run(policy, temperature, policy != cache::Policy::kNone);
    }
  }
}

// FoX Pro's key/value shift carries a row from one token to the next (kernels/cpu/shift_state.h):
// a cached state carries it too (before, the hit failed the forward).
TEST_F(SchedulerTest, PrefixCacheHitOnAShiftedModelEqualsAColdRun) {
  auto model = Model::load(std::string(FPA_VECTORS_DIR) + "/hf/fox_pro");
  ASSERT_TRUE(model.ok()) << model.status();
  ASSERT_TRUE(model->get()->config().k_shift && model->get()->config().v_shift);
  model_ = *std::move(model);
  for (const cache::Policy policy : {cache::Policy::kFpa, cache::Policy::kNone}) {
    for (const float temperature : {0.0f, 0.9f}) {
      next_turn_equals_a_cold_run(policy, temperature, /*evicts=*/false);
    }
  }
}

// Snapshots are reclaimable: a request that fits the pool alone never fails for them.
TEST_F(SchedulerTest, CachedPrefixesGiveWayToARequestThatFits) {
  serve(140, {.prefix_cache_share = 0.9});  // 8 streams: 17 pages each
  scheduler_->start();
  for (int i = 0; i < 6; ++i) {
    Job j;
    ASSERT_TRUE(submit(j, params(prompt(40, 10 + i), 8, cache::Policy::kNone)).ok());
    ASSERT_TRUE(j.sink.wait().status.ok());
  }
  EXPECT_GT(scheduler_->prefix_cache()->stats().pages, 0);
  Job big;  // 16 pages a stream, alone
  ASSERT_TRUE(submit(big, params(prompt(200, 30), 50, cache::Policy::kNone)).ok());
  const Completion& done = big.sink.wait();
  EXPECT_TRUE(done.status.ok()) << done.status;
  EXPECT_GT(scheduler_->prefix_cache()->stats().evictions, 0);
  expect_empty();
}

}  // namespace
}  // namespace fpa::server
