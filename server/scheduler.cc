#include "server/scheduler.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "server/text.h"

namespace fpa::server {
namespace {

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// Why a request must stop now, if it must.
absl::Status interruption(const Request& r, Clock::time_point now) {
  // gRPC cancels a call whose deadline passed, so the deadline is checked first.
  if (now > r.deadline) return absl::DeadlineExceededError("deadline exceeded");
  if (r.cancelled) return absl::CancelledError("cancelled by the client");
  return absl::OkStatus();
}

}  // namespace

struct Scheduler::Active {
  explicit Active(std::shared_ptr<Request> r) : req(std::move(r)), sampler(req->params.sampling) {}

  const std::vector<int32_t>& prompt() const { return req->params.prompt; }
  bool prefilling() const { return prefilled < prompt().size(); }

  std::shared_ptr<Request> req;
  cache::SeqId seq = -1;
  size_t prefilled = 0;     // prompt tokens already in the cache
  int32_t next_token = -1;  // sampled last step, fed in the next decode step
  int generated = 0;
  Sampler sampler;
  Utf8Decoder text;
  Clock::time_point last_token;
  FinishReason reason = FinishReason::kNone;
  bool done = false;
};

Scheduler::Scheduler(ModelRunner& runner, SchedulerOptions options, ServerMetrics* metrics)
    : runner_(runner), options_(options), metrics_(metrics) {}

Scheduler::~Scheduler() {
  if (thread_.joinable()) drain(std::chrono::seconds(0));
}

void Scheduler::start() {
  thread_ = std::thread([this] { loop(); });
}

absl::Status Scheduler::submit(std::shared_ptr<Request> request) {
  std::lock_guard lock(mu_);
  if (!accepting_) return absl::UnavailableError("server is shutting down");
  // Requests the batch can take at the next iteration do not count as queued.
  int free_slots = std::max(0, options_.max_batch - n_running_.load());
  if (static_cast<int>(waiting_.size()) >= options_.max_queue + free_slots) {
    return absl::ResourceExhaustedError(absl::StrCat("request queue full: ", waiting_.size(),
                                                     " requests waiting (--max-queue ",
                                                     options_.max_queue, ")"));
  }
  waiting_.push_back(std::move(request));
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
  std::vector<std::shared_ptr<Request>> admitted;     // join the batch now
  std::vector<std::shared_ptr<Request>> interrupted;  // cancelled or expired while waiting
  std::vector<std::shared_ptr<Request>> aborted;      // still waiting when the drain ran out
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
  for (auto& r : waiting_) {
    if (in.abort) {
      in.aborted.push_back(std::move(r));
    } else if (!interruption(*r, now).ok()) {
      in.interrupted.push_back(std::move(r));
    } else if (static_cast<int>(running_.size() + in.admitted.size()) < options_.max_batch) {
      in.admitted.push_back(std::move(r));
    }
  }
  std::erase(waiting_, nullptr);  // the moved-from entries
  n_waiting_ = static_cast<int>(waiting_.size());
  n_running_ = static_cast<int>(running_.size() + in.admitted.size());
  in.exit = stopping_ && waiting_.empty() && running_.empty() && in.admitted.empty();
  return in;
}

void Scheduler::loop() {
  for (;;) {
    Intake in = take_work();
    if (in.abort) {
      absl::Status shutting_down =
          absl::UnavailableError("server shut down before the request finished");
      for (auto& r : in.aborted) fail_waiting(std::move(r), shutting_down);
      for (auto& a : running_) complete(*a, shutting_down);
      running_.clear();
      break;
    }
    if (in.exit) break;
    for (auto& r : in.interrupted) fail_waiting(r, interruption(*r, Clock::now()));
    admit(std::move(in.admitted));
    reap();
    if (!running_.empty()) iterate();
    std::erase_if(running_, [](const auto& a) { return a->done; });
    n_running_ = static_cast<int>(running_.size());
    if (metrics_ != nullptr) metrics_->set_queue(n_running_, n_waiting_);
  }
  n_running_ = 0;
  if (metrics_ != nullptr) metrics_->set_queue(0, 0);
  std::lock_guard lock(mu_);
  exited_ = true;
  done_.notify_all();
}

void Scheduler::admit(std::vector<std::shared_ptr<Request>> admitted) {
  for (auto& r : admitted) {
    auto a = std::make_unique<Active>(std::move(r));
    absl::StatusOr<cache::SeqId> seq = runner_.start(a->req->params.policy);
    if (!seq.ok()) {
      complete(*a, seq.status());
      continue;
    }
    a->seq = *seq;
    running_.push_back(std::move(a));
  }
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
  // One decode token for every request past its prompt; prompt chunks first come first served
  // within the per-iteration budget. A request's chunks always start at multiples of
  // prefill_chunk, as in ModelRunner::generate, so batching does not change what it computes.
  std::vector<StepInput> inputs;
  std::vector<Active*> owners;
  int prefill_tokens = 0;
  for (auto& a : running_) {
    if (!a->prefilling()) {
      inputs.push_back({a->seq, std::span<const int32_t>(&a->next_token, 1)});
      owners.push_back(a.get());
      continue;
    }
    size_t n = std::min<size_t>(a->prompt().size() - a->prefilled, options_.prefill_chunk);
    if (prefill_tokens > 0 && prefill_tokens + static_cast<int>(n) > options_.prefill_chunk)
      continue;
    prefill_tokens += static_cast<int>(n);
    inputs.push_back({a->seq, std::span<const int32_t>(a->prompt()).subspan(a->prefilled, n)});
    owners.push_back(a.get());
  }

  // Make the step fit the cache: defer prompt chunks while something decodes, else fail the
  // youngest request.
  auto drop = [&](size_t i) {
    inputs.erase(inputs.begin() + static_cast<std::ptrdiff_t>(i));
    owners.erase(owners.begin() + static_cast<std::ptrdiff_t>(i));
  };
  while (!inputs.empty() && runner_.pages_needed(inputs) > runner_.cache().free_pages()) {
    auto last_prefill =
        std::find_if(owners.rbegin(), owners.rend(), [](Active* a) { return a->prefilling(); });
    bool any_decode =
        std::any_of(owners.begin(), owners.end(), [](Active* a) { return !a->prefilling(); });
    if (any_decode && last_prefill != owners.rend()) {
      drop(static_cast<size_t>(owners.rend() - last_prefill - 1));
      continue;
    }
    complete(*owners.back(),
             absl::ResourceExhaustedError("KV cache exhausted: the running requests need more "
                                          "pages than the pool has (--cache-bytes)"));
    drop(inputs.size() - 1);
  }
  if (inputs.empty()) return;

  const int vocab = runner_.model().config().vocab_size;
  logits_.resize(inputs.size() * static_cast<size_t>(vocab));
  absl::Status st = runner_.step(inputs, logits_);
  if (!st.ok()) {
    // A step that fails leaves the cache unchanged; resource shortage costs the youngest request,
    // anything else is a bug that fails the whole step.
    if (absl::IsResourceExhausted(st)) {
      complete(*owners.back(), st);
    } else {
      for (Active* a : owners) complete(*a, st);
    }
    return;
  }

  for (size_t i = 0; i < inputs.size(); ++i) {
    Active& a = *owners[i];
    if (a.prefilling()) {
      a.prefilled += inputs[i].tokens.size();
      if (metrics_ != nullptr)
        metrics_->add_prompt_tokens(static_cast<int64_t>(inputs[i].tokens.size()));
      if (a.prefilling()) continue;
    }
    float logprob = 0;
    std::span<const float> row(logits_.data() + i * static_cast<size_t>(vocab), vocab);
    int32_t token = a.sampler.sample(row, a.req->params.logprobs ? &logprob : nullptr);
    emit(a, token, logprob);
  }
}

void Scheduler::emit(Active& a, int32_t token, float logprob) {
  const GenerationParams& p = a.req->params;
  Clock::time_point now = Clock::now();
  if (metrics_ != nullptr) {
    if (a.generated == 0) {
      metrics_->observe_ttft(seconds(now - a.req->arrival));
    } else {
      metrics_->observe_inter_token(seconds(now - a.last_token));
    }
    metrics_->add_generated_tokens(1);
  }
  a.last_token = now;
  ++a.generated;
  a.next_token = token;

  TokenChunk chunk;
  chunk.ids.push_back(token);
  if (p.logprobs) chunk.logprobs.push_back(logprob);
  chunk.text = a.text.push(chunk.ids);

  if (token == runner_.model().config().eos_id && !p.ignore_eos) {
    a.reason = FinishReason::kEos;
  } else if (std::any_of(p.stop.begin(), p.stop.end(),
                         [&](const std::string& s) { return a.text.bytes().ends_with(s); })) {
    a.reason = FinishReason::kStop;
  } else if (a.generated >= p.max_new_tokens) {
    a.reason = FinishReason::kLength;
  }
  a.req->sink->on_tokens(std::move(chunk));
  if (a.reason != FinishReason::kNone) complete(a, absl::OkStatus());
}

void Scheduler::complete(Active& a, absl::Status status) {
  if (a.done) return;
  a.done = true;
  Completion c;
  c.status = std::move(status);
  c.reason = a.reason;
  c.text_tail = a.text.finish();
  c.usage.prompt_tokens = static_cast<int32_t>(a.prompt().size());
  c.usage.generated_tokens = a.generated;
  if (a.seq >= 0) {
    cache::SequenceStats s = runner_.cache().sequence_stats(a.seq);
    cache::CacheStats all = runner_.cache().stats();
    const cache::CacheShape& shape = runner_.cache().shape();
    c.usage.peak_live_keys = s.peak_live_keys;
    c.usage.live_fraction = s.length > 0 ? s.live_fraction() : 0.0;
    c.usage.cache_bytes_held = s.pages * shape.page_slots * all.bytes_per_key;
    c.usage.cache_bytes_full = s.full_keys * all.bytes_per_key;
    runner_.finish(a.seq);
    a.seq = -1;
    if (metrics_ != nullptr && s.length > 0) metrics_->observe_live_fraction(c.usage.live_fraction);
  }
  if (metrics_ != nullptr && c.status.ok()) {
    metrics_->observe_request_duration(seconds(Clock::now() - a.req->arrival));
  }
  a.req->sink->on_finish(std::move(c));
}

void Scheduler::fail_waiting(std::shared_ptr<Request> request, const absl::Status& status) {
  Active a(std::move(request));
  complete(a, status);
}

}  // namespace fpa::server
