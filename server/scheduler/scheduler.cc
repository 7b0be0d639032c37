#include "server/scheduler/scheduler.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "cache/eviction.h"
#include "server/request/stop_strings.h"

namespace fpa::server {
namespace {

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// A client's deadline runs from when it sent the call, the server's from when it read it, so the
// client's cancellation at its deadline reaches the server up to a transit time early.
constexpr Clock::duration kDeadlineSkew = std::chrono::milliseconds(250);

// Why a request must stop now, if it must.
absl::Status interruption(const Request& r, Clock::time_point now) {
  // gRPC cancels a call whose deadline passed, so the deadline is checked first.
  if (now > r.deadline) return absl::DeadlineExceededError("deadline exceeded");
  if (!r.cancelled()) return absl::OkStatus();
  if (r.deadline != Clock::time_point::max() && r.cancelled_at() + kDeadlineSkew > r.deadline) {
    return absl::DeadlineExceededError("deadline exceeded");
  }
  return absl::CancelledError("cancelled by the client");
}

// The sampler's rules with the ids min_tokens holds back: EOS (unless ignored), stop ids.
SamplingParams sampling_of(const GenerationParams& p, int32_t eos) {
  SamplingParams s = p.sampling;
  if (s.rules.min_tokens > 0) {
    s.rules.end_ids = p.stop_token_ids;
    if (!p.ignore_eos) s.rules.end_ids.push_back(eos);
  }
  return s;
}

}  // namespace

struct Scheduler::Active {
  Active(std::shared_ptr<Request> r, const Tokenizer& tokenizer, int32_t eos)
      : req(std::move(r)),
        kv(req->params.policy, static_cast<int64_t>(req->params.prompt.size()),
           req->params.max_new_tokens),
        context(req->params.prompt),
        sampler(sampling_of(req->params, eos), req->params.prompt),
        text(tokenizer) {}

  size_t prompt_size() const { return req->params.prompt.size(); }
  // Tokens the cache must hold before the next decode step: the prompt, or after a preemption
  // the prompt and every output token but the last, which that decode step feeds.
  size_t target() const { return generated == 0 ? prompt_size() : context.size() - 1; }
  bool prefilling() const { return cached < target(); }
  // The next step's tokens (cache::next_step_tokens): chunks on a solo run's boundaries, so that
  // batching and recomputing compute what a solo run does unless a tight pool made the planner
  // shrink one, generated tokens one at a time where chunks would not replay decode; or one
  // decode token.
  size_t next_tokens(size_t chunk) const {
    return static_cast<size_t>(cache::next_step_tokens(
        static_cast<int64_t>(prompt_size()), static_cast<int64_t>(target()),
        static_cast<int64_t>(cached), static_cast<int64_t>(chunk), kv.replay_chunks));
  }
  // The KV manager judges admission by each request's next step: kept current through this.
  int64_t refresh_next(size_t chunk) {
    return kv.next_tokens = static_cast<int64_t>(next_tokens(chunk));
  }

  std::shared_ptr<Request> req;
  cache::KvRequest kv;           // its memory, as the KV manager tracks it
  std::vector<int32_t> context;  // the prompt, then every generated token
  size_t cached = 0;             // tokens of context in the cache
  size_t high_water = 0;         // most tokens ever cached: below it, prefill is recomputation
  int generated = 0;
  int preemptions = 0;
  int64_t recomputed = 0;
  int64_t cached_prompt = 0;          // prompt tokens the prefix cache held when it started
  bool preempted = false;             // released this iteration, goes back to the queue
  Sampler sampler;                    // survives preemption, so sampling continues where it stopped
  std::vector<Scored> prompt_scores;  // prompt_logprobs: [i] scores prompt token i (i >= 1)
  TokenStream text;
  Clock::time_point admitted;     // first admission: the end of its queue time
  Clock::time_point first_token;  // the end of its prefill
  Clock::time_point last_token;
  FinishReason reason = FinishReason::kNone;
  bool done = false;
};

struct Scheduler::Plan {
  std::vector<cache::BatchItem> inputs;
  std::vector<Active*> owners;
  bool all_logits = false;  // a prompt being scored needs every row, item after item
};

Scheduler::Scheduler(ModelRunner& runner, SchedulerOptions options, ServerMetrics* metrics)
    : runner_(runner),
      options_(std::move(options)),
      metrics_(metrics),
      kv_(runner_.cache(), {.watermark = options_.watermark,
                            .prefix_cache_share = options_.prefix_cache_share,
                            .pool_flag = options_.pool_flag}) {
  // The scheduler owns the KV manager, so it alone says how long a scrape may read its prefixes.
  if (kv_.prefix_cache() != nullptr && metrics_ != nullptr) {
    metrics_->watch_prefix_cache(kv_.prefix_cache());
  }
}

Scheduler::~Scheduler() {
  if (thread_.joinable()) drain(std::chrono::seconds(0));
  if (kv_.prefix_cache() != nullptr && metrics_ != nullptr) metrics_->watch_prefix_cache(nullptr);
}

void Scheduler::start() {
  thread_ = std::thread([this] { loop(); });
}

absl::Status Scheduler::submit(std::shared_ptr<Request> request) {
  auto active = std::make_unique<Active>(std::move(request), runner_.model().tokenizer(),
                                         runner_.model().config().eos_id);
  if (absl::Status st = kv_.check_fits_alone(active->kv); !st.ok()) return st;
  std::lock_guard lock(mu_);
  if (!accepting_) return absl::UnavailableError("server is shutting down");
  // Requests the batch can take at the next iteration do not count as queued.
  int free_slots = std::max(0, options_.max_batch - n_running_.load());
  if (static_cast<int>(waiting_.size()) >= options_.max_queue + free_slots) {
    return absl::ResourceExhaustedError(absl::StrCat("request queue full: ", waiting_.size(),
                                                     " requests waiting (--max-queue ",
                                                     options_.max_queue, ")"));
  }
  waiting_.push_back(std::move(active));
  n_waiting_ = static_cast<int>(waiting_.size());
  wake_.notify_one();
  return absl::OkStatus();
}

void Scheduler::drain(std::chrono::duration<double> grace) {
  std::unique_lock lock(mu_);
  accepting_ = false;
  stopping_ = true;
  wake_.notify_all();
  if (!done_.wait_for(lock, grace, [&] { return exited_; })) {
    aborting_ = true;
    wake_.notify_all();
  }
  lock.unlock();
  if (thread_.joinable()) thread_.join();
}

// What the scheduler thread takes from the shared state at the top of an iteration.
struct Scheduler::Intake {
  std::vector<std::unique_ptr<Active>> interrupted;  // cancelled or expired while waiting
  std::vector<std::unique_ptr<Active>> aborted;      // still waiting when the drain ran out
  bool abort = false;
  bool exit = false;  // draining and idle
};

Scheduler::Intake Scheduler::take_work() {
  Intake in;
  std::unique_lock lock(mu_);
  wake_.wait(lock,
             [&] { return aborting_ || stopping_ || !waiting_.empty() || !running_.empty(); });
  in.abort = aborting_;
  Clock::time_point now = Clock::now();
  for (auto& a : waiting_) {
    if (in.abort) {
      in.aborted.push_back(std::move(a));
    } else if (!interruption(*a->req, now).ok()) {
      in.interrupted.push_back(std::move(a));
    }
  }
  std::erase(waiting_, nullptr);  // the moved-from entries
  n_waiting_ = static_cast<int>(waiting_.size());
  in.exit = stopping_ && waiting_.empty() && running_.empty();
  return in;
}

void Scheduler::loop() {
  for (;;) {
    Intake in = take_work();
    if (in.abort) {
      absl::Status shutting_down =
          absl::UnavailableError("server shut down before the request finished");
      for (auto& a : in.aborted) complete(*a, shutting_down);
      for (auto& a : running_) complete(*a, shutting_down);
      running_.clear();
      break;
    }
    if (in.exit) break;
    for (auto& a : in.interrupted) complete(*a, interruption(*a->req, Clock::now()));
    reap();
    admit();
    if (!running_.empty()) iterate();
    std::erase_if(running_, [](const auto& a) { return a->done; });
    n_running_ = static_cast<int>(running_.size());
    if (metrics_ != nullptr) metrics_->set_queue(n_running_, n_waiting_);
  }
  n_running_ = 0;
  if (metrics_ != nullptr) metrics_->set_queue(0, 0);
  kv_.flush();
  std::lock_guard lock(mu_);
  exited_ = true;
  done_.notify_all();
}

void Scheduler::admit() {
  for (auto& r : running_) r->refresh_next(options_.prefill_chunk);
  for (;;) {
    std::unique_ptr<Active> a;
    {
      std::lock_guard lock(mu_);
      if (waiting_.empty() || static_cast<int>(running_.size()) >= options_.max_batch) break;
      Active& next = *waiting_.front();
      next.refresh_next(options_.prefill_chunk);
      if (!kv_.can_admit(next.kv)) break;
      a = std::move(waiting_.front());
      waiting_.pop_front();
      n_waiting_ = static_cast<int>(waiting_.size());
      // Counted as running before the lock goes: a request between the queue and the batch is
      // in neither, and submit() would take one more than --max-batch + --max-queue.
      n_running_ = static_cast<int>(running_.size()) + 1;
    }
    if (absl::Status st = start_sequence(*a); !st.ok()) {
      complete(*a, st);
      n_running_ = static_cast<int>(running_.size());
      continue;
    }
    a->refresh_next(options_.prefill_chunk);
    if (a->admitted == Clock::time_point{}) a->admitted = Clock::now();
    // In order of first admission, so that a readmitted request is older than those admitted
    // since, and the next victim is the newest arrival rather than the one just recomputed.
    auto at = std::upper_bound(running_.begin(), running_.end(), a->admitted,
                               [](Clock::time_point t, const auto& r) { return t < r->admitted; });
    running_.insert(at, std::move(a));
  }
  n_running_ = static_cast<int>(running_.size());
}

// Its sequence from the KV manager, from the longest cached prefix that serves it. A prompt being
// scored is prefilled whole: a cached prefix has no logits.
absl::Status Scheduler::start_sequence(Active& a) {
  if (absl::Status st = runner_.check_policy(a.kv.policy); !st.ok()) return st;
  const bool resume = a.generated > 0;
  absl::StatusOr<int64_t> cached =
      kv_.admit(a.kv, {.context = a.context,
                       .resume = resume,
                       .scoring = a.req->params.prompt_logprobs && !resume,
                       // Counted once a request: a readmission's lookup is not a client's query.
                       .count = a.admitted == Clock::time_point{}});
  if (!cached.ok()) return cached.status();
  a.cached = static_cast<size_t>(*cached);
  a.high_water = std::max(a.high_water, a.cached);
  if (!resume) a.cached_prompt = *cached;
  return absl::OkStatus();
}

// Cancelled and expired requests leave before the step, so their pages are free for it.
void Scheduler::reap() {
  Clock::time_point now = Clock::now();
  for (auto& a : running_) {
    if (absl::Status st = interruption(*a->req, now); !st.ok()) complete(*a, std::move(st));
  }
  std::erase_if(running_, [](const auto& a) { return a->done; });
}

void Scheduler::iterate() {
  Plan plan = plan_step();
  // Preempted requests go back to the head of the queue, oldest admission first.
  std::vector<std::unique_ptr<Active>> back;
  for (auto& a : running_) {
    if (a->preempted) back.push_back(std::move(a));
  }
  std::erase(running_, nullptr);
  if (!back.empty()) {
    std::lock_guard lock(mu_);
    for (auto it = back.rbegin(); it != back.rend(); ++it) {
      (*it)->preempted = false;
      waiting_.push_front(std::move(*it));
    }
    n_waiting_ = static_cast<int>(waiting_.size());
    n_running_ = static_cast<int>(running_.size());  // each request counted once
  }
  if (plan.inputs.empty()) return;

  const int vocab = runner_.model().config().vocab_size;
  size_t rows = plan.inputs.size();
  if (plan.all_logits) {
    rows = 0;
    for (const cache::BatchItem& in : plan.inputs) rows += in.tokens.size();
  }
  logits_.resize(rows * static_cast<size_t>(vocab));
  // The step was reserved, so any failure is a bug: it fails the whole step.
  if (absl::Status st = runner_.step(plan.inputs, logits_, plan.all_logits); !st.ok()) {
    for (Active* a : plan.owners) complete(*a, st);
    return;
  }
  record_step(plan);
}

// The step as the KV manager plans and reserves it: cached prefixes reclaimed, victims preempted
// and requests that cannot fit even alone failed (their pages already back in the pool), then
// every planned item's pages reserved.
Scheduler::Plan Scheduler::plan_step() {
  std::vector<Active*> live;
  std::vector<cache::StepAsk> asks;
  for (auto& owned : running_) {
    Active& a = *owned;
    if (a.done || a.preempted) continue;
    live.push_back(&a);
    asks.push_back({.request = &a.kv,
                    .prefilling = a.prefilling(),
                    .tokens = a.refresh_next(options_.prefill_chunk),
                    .preemptions = a.preemptions});
  }
  const cache::ReservedStep step = kv_.reserve_step(asks, options_.prefill_chunk);
  for (const size_t v : step.plan.preempted) preempted(*live[v]);
  for (const size_t f : step.plan.failed) {
    complete(*live[f],
             absl::ResourceExhaustedError(absl::StrCat(
                 "KV cache exhausted: the request needs more than the whole pool of ",
                 kv_.cache().stats().pages_total, " pages even alone (", options_.pool_flag, ")")));
  }
  // The plan counted these pages free, so a refusal is a bug in that arithmetic.
  for (const size_t b : step.broken) {
    complete(*live[b], absl::InternalError("step planner: a planned reservation failed"));
  }
  Plan plan;
  for (const cache::StepPlan::Item& item : step.plan.items) {
    Active& a = *live[item.entry];
    if (a.done) continue;
    plan.inputs.push_back({a.kv.seq,
                           std::span<const int32_t>(a.context).subspan(a.cached, item.tokens),
                           static_cast<int32_t>(a.cached)});
    plan.owners.push_back(&a);
    plan.all_logits |= a.prefilling() && a.req->params.prompt_logprobs && a.generated == 0;
  }
  return plan;
}

// The KV manager took its pages back; it returns to the queue with what it generated.
void Scheduler::preempted(Active& a) {
  if (a.cached > 0) {
    ++a.preemptions;
    if (metrics_ != nullptr) metrics_->add_preemption();
  }
  a.cached = 0;
  a.preempted = true;
}

void Scheduler::record_step(const Plan& plan) {
  const auto vocab = static_cast<size_t>(runner_.model().config().vocab_size);
  size_t next_row = 0;
  for (size_t i = 0; i < plan.inputs.size(); ++i) {
    Active& a = *plan.owners[i];
    const size_t n = plan.inputs[i].tokens.size();
    const size_t first_row = plan.all_logits ? next_row : i;
    next_row += n;
    const size_t last_row = plan.all_logits ? first_row + n - 1 : i;
    if (plan.all_logits && a.req->params.prompt_logprobs && a.generated == 0) {
      score_prompt(a, a.cached, {logits_.data() + first_row * vocab, n * vocab});
    }
    const bool was_prefill = a.prefilling();
    const size_t from = a.cached;
    a.cached += n;
    const size_t redone = std::min(a.cached, a.high_water) - std::min(from, a.high_water);
    a.recomputed += static_cast<int64_t>(redone);
    const size_t fresh_prompt = std::min(a.cached, a.prompt_size()) -
                                std::min(std::max(from, a.high_water), a.prompt_size());
    a.high_water = std::max(a.high_water, a.cached);
    if (metrics_ != nullptr) {
      if (redone > 0) metrics_->add_recomputed_tokens(static_cast<int64_t>(redone));
      if (fresh_prompt > 0) metrics_->add_prompt_tokens(static_cast<int64_t>(fresh_prompt));
    }
    // A resumed request already has the token this chunk's logits predict.
    if (a.prefilling() || (was_prefill && a.generated > 0)) continue;
    if (was_prefill && a.req->params.prompt_logprobs && !send_prompt_scores(a)) continue;
    Scored scored;
    std::span<const float> row(logits_.data() + last_row * vocab, vocab);
    int32_t token = a.sampler.sample(row, a.req->params.logprobs ? &scored : nullptr);
    emit(a, token, std::move(scored));
    // The prompt's state is cached once its first token is out, so as not to delay it.
    if (was_prefill && a.generated == 1 && !a.done) {
      kv_.offer(a.kv, std::span<const int32_t>(a.context).first(a.cached));
    }
  }
}

// Scores the prompt tokens that the rows of a chunk starting at prompt position `from` predict.
void Scheduler::score_prompt(Active& a, size_t from, std::span<const float> rows) {
  const size_t vocab = static_cast<size_t>(runner_.model().config().vocab_size);
  a.prompt_scores.resize(a.prompt_size());
  for (size_t k = 0; k < rows.size() / vocab; ++k) {
    const size_t predicted = from + k + 1;
    if (predicted >= a.prompt_size()) break;
    a.prompt_scores[predicted] = score(rows.subspan(k * vocab, vocab), a.context[predicted],
                                       a.req->params.prompt_top_logprobs);
  }
}

// The scored prompt, once prefilled; false when that ends the request (max_new_tokens 0).
bool Scheduler::send_prompt_scores(Active& a) {
  TokenChunk chunk;
  chunk.prompt = true;
  chunk.ids = a.req->params.prompt;
  a.prompt_scores.resize(a.prompt_size());
  a.prompt_scores[0].logprob = std::numeric_limits<float>::quiet_NaN();
  for (Scored& s : a.prompt_scores) {
    chunk.logprobs.push_back(s.logprob);
    chunk.top.push_back(std::move(s.top));
    chunk.ranks.push_back(s.rank);
  }
  a.prompt_scores.clear();
  a.req->sink->on_tokens(std::move(chunk));
  if (a.req->params.max_new_tokens > 0) return true;
  a.reason = FinishReason::kLength;
  complete(a, absl::OkStatus());
  return false;
}

void Scheduler::emit(Active& a, int32_t token, Scored scored) {
  const GenerationParams& p = a.req->params;
  Clock::time_point now = Clock::now();
  if (metrics_ != nullptr) {
    if (a.generated == 0) {
      a.first_token = now;
      metrics_->observe_ttft(seconds(now - a.req->arrival));
    } else {
      metrics_->observe_inter_token(seconds(now - a.last_token));
    }
    metrics_->add_generated_tokens(1);
  }
  a.last_token = now;
  ++a.generated;
  a.context.push_back(token);

  TokenChunk chunk;
  chunk.ids.push_back(token);
  if (p.logprobs) {
    chunk.logprobs.push_back(scored.logprob);
    chunk.top.push_back(std::move(scored.top));
  }
  const size_t bytes_before = a.text.bytes().size();
  chunk.text = a.text.push(chunk.ids);

  // As vLLM: the first min_tokens tokens end nothing (the sampler keeps EOS and stop ids out).
  const bool may_stop = a.generated > p.sampling.rules.min_tokens;
  if (may_stop && token == runner_.model().config().eos_id && !p.ignore_eos) {
    a.reason = FinishReason::kEos;
  } else if (may_stop &&
             (std::ranges::find(p.stop_token_ids, token) != p.stop_token_ids.end() ||
              stop_in_tail(a.text.bytes(), a.text.bytes().size() - bytes_before, p.stop))) {
    a.reason = FinishReason::kStop;
  } else if (a.generated >= p.max_new_tokens) {
    a.reason = FinishReason::kLength;
  }
  a.req->sink->on_tokens(std::move(chunk));
  if (a.reason != FinishReason::kNone) complete(a, absl::OkStatus());
}

// What the per-request series record of a request that finished with OK.
FinishedRequest Scheduler::finished(const Active& a) const {
  const Clock::time_point now = Clock::now();
  FinishedRequest r;
  r.e2e_seconds = seconds(now - a.req->arrival);
  r.queue_seconds = seconds(a.admitted - a.req->arrival);
  r.prefill_seconds = seconds(a.first_token - a.admitted);
  r.decode_seconds = seconds(now - a.first_token);
  r.prompt_tokens = static_cast<int64_t>(a.prompt_size());
  r.generated_tokens = a.generated;
  r.max_new_tokens = a.req->params.max_new_tokens;
  r.finished_reason = a.reason == FinishReason::kLength ? "length" : "stop";
  return r;
}

void Scheduler::complete(Active& a, absl::Status status) {
  if (a.done) return;
  a.done = true;
  Completion c;
  c.status = std::move(status);
  c.reason = a.reason;
  c.text_tail = a.text.finish();
  c.usage.prompt_tokens = static_cast<int32_t>(a.prompt_size());
  c.usage.generated_tokens = a.generated;
  c.usage.preemptions = a.preemptions;
  c.usage.recomputed_tokens = a.recomputed;
  c.usage.cached_tokens = a.cached_prompt;
  if (a.kv.seq >= 0) {
    cache::SequenceStats s = kv_.sequence_stats(a.kv);
    cache::CacheStats all = kv_.cache().stats();
    const cache::CacheShape& shape = kv_.cache().shape();
    c.usage.peak_live_keys = s.peak_live_keys;
    c.usage.live_fraction = s.length > 0 ? s.live_fraction() : 0.0;
    c.usage.cache_bytes_held = s.pages * shape.page_slots * all.bytes_per_key;
    c.usage.cache_bytes_full = s.full_keys * all.bytes_per_key;
    // Its sequence becomes the cached state of what it holds, or its pages go back.
    kv_.finish(a.kv, std::span<const int32_t>(a.context).first(a.cached), c.status.ok());
    if (metrics_ != nullptr && s.length > 0) metrics_->observe_live_fraction(c.usage.live_fraction);
  }
  if (metrics_ != nullptr) {
    if (c.status.ok()) {
      metrics_->observe_finished(finished(a));
    } else {
      metrics_->count_aborted();
    }
  }
  a.req->sink->on_finish(std::move(c));
}

}  // namespace fpa::server
