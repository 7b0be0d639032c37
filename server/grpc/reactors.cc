#include "server/grpc/reactors.h"

#include <algorithm>
#include <deque>
#include <memory>
#include <mutex>

#include "server/grpc/grpc_handoff.h"
#include "server/grpc/service.h"
#include "server/grpc/wire.h"
#include "server/request/request.h"

namespace fpa::server {
namespace {

v1::FinishReason to_proto(FinishReason r) {
  switch (r) {
    case FinishReason::kLength:
      return v1::FINISH_REASON_LENGTH;
    case FinishReason::kEos:
      return v1::FINISH_REASON_EOS;
    case FinishReason::kStop:
      return v1::FINISH_REASON_STOP;
    case FinishReason::kNone:
      break;
  }
  return v1::FINISH_REASON_UNSPECIFIED;
}

void fill_usage(const Usage& u, v1::Usage* out) {
  out->set_prompt_tokens(u.prompt_tokens);
  out->set_generated_tokens(u.generated_tokens);
  out->set_peak_live_keys(u.peak_live_keys);
  out->set_live_fraction(u.live_fraction);
  out->set_cache_bytes_held(u.cache_bytes_held);
  out->set_preemptions(u.preemptions);
  out->set_recomputed_tokens(u.recomputed_tokens);
  out->set_cached_tokens(u.cached_tokens);
  out->set_cache_bytes_full(u.cache_bytes_full);
}

void add_top(const std::vector<std::vector<TokenLogprob>>& top,
             google::protobuf::RepeatedPtrField<v1::TopLogprobs>* out) {
  for (const std::vector<TokenLogprob>& position : top) {
    v1::TopLogprobs* t = out->Add();
    for (const TokenLogprob& alt : position) {
      t->add_token_ids(alt.token);
      t->add_logprobs(alt.logprob);
    }
  }
}

// The sampler fills `top` (empty lists) whenever logprobs are on; only top_logprobs > 0 sends it.
bool has_alternatives(const std::vector<std::vector<TokenLogprob>>& top) {
  return std::ranges::any_of(top, [](const auto& t) { return !t.empty(); });
}

template <typename Msg>
void append_tokens(const TokenChunk& c, Msg* m) {
  if (c.prompt) {
    m->mutable_prompt_logprobs()->Add(c.logprobs.begin(), c.logprobs.end());
    if (has_alternatives(c.top)) add_top(c.top, m->mutable_prompt_top_logprobs());
    return;
  }
  m->mutable_token_ids()->Add(c.ids.begin(), c.ids.end());
  m->mutable_logprobs()->Add(c.logprobs.begin(), c.logprobs.end());
  if (has_alternatives(c.top)) add_top(c.top, m->mutable_top_logprobs());
  m->mutable_text()->append(c.text);
}

class UnaryGenerate final : public grpc::ServerUnaryReactor, public RequestSink {
 public:
  UnaryGenerate(FpaServiceImpl& service, grpc::ByteBuffer* out) : service_(service), out_(out) {}

  void start(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer& req) {
    // After a successful submit the scheduler owns the call (it may finish it at once).
    if (absl::Status st = service_.submit(ctx, req, this, &request_); !st.ok()) finish(st);
  }

  void on_tokens(TokenChunk chunk) override { append_tokens(chunk, &resp_); }

  void on_finish(Completion done) override {
    resp_.mutable_text()->append(done.text_tail);
    resp_.set_finish_reason(to_proto(done.reason));
    fill_usage(done.usage, resp_.mutable_usage());
    if (done.status.ok()) encode(resp_, out_);
    finish(done.status);
  }

  void OnCancel() override {
    const InGrpcCallback mark(this);
    if (request_) request_->cancel();
  }
  void OnDone() override {
    called_by_grpc(this);
    delete this;
  }

 private:
  void finish(const absl::Status& st) {
    service_.metrics().count_request(static_cast<int>(st.code()));
    const IntoGrpc into(this);
    Finish(to_grpc(st));
  }

  FpaServiceImpl& service_;
  grpc::ByteBuffer* out_;
  v1::GenerateResponse resp_;
  std::shared_ptr<Request> request_;
};

// Writes one message at a time, as gRPC requires; messages that pile up behind a slow client are
// merged into one token group.
class StreamGenerate final : public grpc::ServerWriteReactor<grpc::ByteBuffer>, public RequestSink {
 public:
  explicit StreamGenerate(FpaServiceImpl& service) : service_(service) {}

  void start(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer& req) {
    if (absl::Status st = service_.submit(ctx, req, this, &request_); !st.ok()) {
      service_.metrics().count_request(static_cast<int>(st.code()));
      const IntoGrpc into(this);
      Finish(to_grpc(st));
    }
  }

  void on_tokens(TokenChunk chunk) override {
    Outgoing o;
    append_tokens(chunk, &o.msg);
    enqueue(std::move(o));
  }

  void on_finish(Completion done) override {
    Outgoing o;
    o.last = true;
    o.status = to_grpc(done.status);
    o.code = static_cast<int>(done.status.code());
    if (done.status.ok()) {
      o.msg.set_text(done.text_tail);
      o.msg.set_finish_reason(to_proto(done.reason));
      fill_usage(done.usage, o.msg.mutable_usage());
    }
    enqueue(std::move(o));
  }

  void OnWriteDone(bool ok) override {
    const InGrpcCallback mark(this);
    std::unique_lock lock(mu_);
    writing_ = false;
    if (!ok) {
      broken_ = true;  // the client is gone: stop generating for it
      request_->cancel();
    }
    pump(lock);
  }
  void OnCancel() override {
    const InGrpcCallback mark(this);
    if (request_) request_->cancel();
  }
  void OnDone() override {
    called_by_grpc(this);
    delete this;
  }

 private:
  struct Outgoing {
    v1::GenerateStreamResponse msg;
    bool last = false;
    grpc::Status status;
    int code = 0;
  };

  void enqueue(Outgoing o) {
    std::unique_lock lock(mu_);
    queue_.push_back(std::move(o));
    if (!writing_) pump(lock);
  }

  // Starts the next write (or the finish) when none is in flight. Called with mu_ held; releases
  // it before calling into gRPC.
  void pump(std::unique_lock<std::mutex>& lock) {
    if (broken_) {
      // Tokens nobody can receive are dropped, but never the last message: it finishes the call.
      while (!queue_.empty() && !queue_.front().last) queue_.pop_front();
    }
    if (queue_.empty()) return;
    Outgoing o = std::move(queue_.front());
    queue_.pop_front();
    while (!o.last && !queue_.empty() && !queue_.front().last) {
      const v1::GenerateStreamResponse& next = queue_.front().msg;
      o.msg.mutable_token_ids()->MergeFrom(next.token_ids());
      o.msg.mutable_logprobs()->MergeFrom(next.logprobs());
      o.msg.mutable_top_logprobs()->MergeFrom(next.top_logprobs());
      o.msg.mutable_prompt_logprobs()->MergeFrom(next.prompt_logprobs());
      o.msg.mutable_prompt_top_logprobs()->MergeFrom(next.prompt_top_logprobs());
      o.msg.mutable_text()->append(next.text());
      queue_.pop_front();
    }
    writing_ = true;  // stays set after the last message: nothing follows it
    if (o.last) {
      if (broken_ && o.status.ok()) {
        // The generation ended but its answer never reached the client.
        o.status = grpc::Status(grpc::StatusCode::CANCELLED, "the client stopped reading");
        o.code = static_cast<int>(grpc::StatusCode::CANCELLED);
      }
      bool with_message = o.status.ok();
      if (with_message) encode(o.msg, &current_);
      lock.unlock();
      service_.metrics().count_request(o.code);
      const IntoGrpc into(this);
      if (with_message) {
        StartWriteAndFinish(&current_, grpc::WriteOptions(), o.status);
      } else {
        Finish(o.status);
      }
      return;
    }
    encode(o.msg, &current_);
    lock.unlock();
    const IntoGrpc into(this);
    StartWrite(&current_);
  }

  FpaServiceImpl& service_;
  std::shared_ptr<Request> request_;
  std::mutex mu_;
  std::deque<Outgoing> queue_;
  bool writing_ = false;
  bool broken_ = false;
  grpc::ByteBuffer current_;  // the message in flight
};

}  // namespace

grpc::ServerUnaryReactor* start_unary_generate(FpaServiceImpl& service,
                                               grpc::CallbackServerContext* ctx,
                                               const grpc::ByteBuffer& req,
                                               grpc::ByteBuffer* resp) {
  auto* r = new UnaryGenerate(service, resp);
  r->start(ctx, req);
  // gRPC runs no callback of r before it has it: r is alive here, whatever start did.
  handed_to_grpc(r);
  return r;
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* start_stream_generate(FpaServiceImpl& service,
                                                                  grpc::CallbackServerContext* ctx,
                                                                  const grpc::ByteBuffer& req) {
  auto* r = new StreamGenerate(service);
  r->start(ctx, req);
  handed_to_grpc(r);
  return r;
}

}  // namespace fpa::server
