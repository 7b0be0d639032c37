#include "server/grpc/service.h"

#include <chrono>

#include "model/config.h"
#include "server/grpc/reactors.h"
#include "server/grpc/wire.h"

namespace fpa::server {
namespace {

grpc::ServerUnaryReactor* reply(grpc::CallbackServerContext* ctx, const absl::Status& st) {
  grpc::ServerUnaryReactor* r = ctx->DefaultReactor();
  r->Finish(to_grpc(st));
  return r;
}

grpc::ServerUnaryReactor* reply(grpc::CallbackServerContext* ctx,
                                const google::protobuf::Message& msg, grpc::ByteBuffer* resp) {
  encode(msg, resp);
  return reply(ctx, absl::OkStatus());
}

}  // namespace

FpaServiceImpl::FpaServiceImpl(const Model& model, const cache::KvCache& cache,
                               Scheduler& scheduler, ServerMetrics& metrics, ServiceInfo info)
    : model_(model),
      cache_(cache),
      scheduler_(scheduler),
      metrics_(metrics),
      info_(std::move(info)) {}

absl::Status FpaServiceImpl::submit(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer& bytes,
                                    RequestSink* sink, std::shared_ptr<Request>* out) {
  v1::GenerateRequest req;
  if (absl::Status st = decode(bytes, &req); !st.ok()) return st;
  absl::StatusOr<GenerationParams> params = to_params(req, info_.limits);
  if (!params.ok()) return params.status();
  if (!req.has_seed()) params->sampling.seed = next_seed_++;
  auto r = std::make_shared<Request>();
  r->params = std::move(*params);
  r->sink = sink;
  auto deadline = ctx->deadline();
  if (deadline != std::chrono::system_clock::time_point::max()) {
    r->deadline = r->arrival + std::chrono::duration_cast<Clock::duration>(
                                   deadline - std::chrono::system_clock::now());
  }
  *out = r;
  return scheduler_.submit(std::move(r));
}

grpc::ServerUnaryReactor* FpaServiceImpl::Generate(grpc::CallbackServerContext* ctx,
                                                   const grpc::ByteBuffer* req,
                                                   grpc::ByteBuffer* resp) {
  return start_unary_generate(*this, ctx, *req, resp);
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* FpaServiceImpl::GenerateStream(
    grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* req) {
  return start_stream_generate(*this, ctx, *req);
}

grpc::ServerUnaryReactor* FpaServiceImpl::Tokenize(grpc::CallbackServerContext* ctx,
                                                   const grpc::ByteBuffer* bytes,
                                                   grpc::ByteBuffer* out) {
  v1::TokenizeRequest req;
  if (absl::Status st = decode(*bytes, &req); !st.ok()) return reply(ctx, st);
  v1::TokenizeResponse resp;
  std::vector<int32_t> ids = model_.tokenizer().encode(req.text());
  resp.mutable_token_ids()->Add(ids.begin(), ids.end());
  return reply(ctx, resp, out);
}

grpc::ServerUnaryReactor* FpaServiceImpl::ModelInfo(grpc::CallbackServerContext* ctx,
                                                    const grpc::ByteBuffer* bytes,
                                                    grpc::ByteBuffer* out) {
  v1::ModelInfoRequest req;
  if (absl::Status st = decode(*bytes, &req); !st.ok()) return reply(ctx, st);
  v1::ModelInfoResponse resp;
  const ModelConfig& c = model_.config();
  resp.set_attention(attention_kind_name(c.attention));
  if (c.attention != AttentionKind::kSoftmax) {
    resp.set_levels(c.attention == AttentionKind::kFpa && c.free_levels ? "free" : "tied");
  }
  resp.set_vocab_size(c.vocab_size);
  resp.set_d_model(c.d_model);
  resp.set_n_layers(c.n_layers);
  resp.set_n_heads(c.n_heads);
  resp.set_head_dim(c.head_dim);
  resp.set_d_ff(c.d_ff);
  resp.set_train_len(c.train_len);
  resp.set_tau(info_.limits.default_tau);
  resp.set_config_json(c.raw_json);
  resp.set_backend(info_.backend);
  resp.set_bos_id(c.bos_id);
  resp.set_eos_id(c.eos_id);
  resp.set_max_batch(info_.max_batch);
  resp.set_max_prompt_tokens(info_.limits.max_prompt_tokens);
  resp.set_max_new_tokens(info_.limits.max_new_tokens);
  resp.set_tokenizer(model_.tokenizer().kind());
  resp.set_cpu_weights(info_.formats.weights);
  resp.set_kv_dtype(info_.formats.kv);
  return reply(ctx, resp, out);
}

grpc::ServerUnaryReactor* FpaServiceImpl::CacheStats(grpc::CallbackServerContext* ctx,
                                                     const grpc::ByteBuffer* bytes,
                                                     grpc::ByteBuffer* out) {
  v1::CacheStatsRequest req;
  if (absl::Status st = decode(*bytes, &req); !st.ok()) return reply(ctx, st);
  v1::CacheStatsResponse resp;
  const auto [s, cached] = cache::held_stats(cache_, scheduler_.prefix_cache());
  resp.set_pages_total(s.pages_total);
  resp.set_pages_in_use(s.pages_in_use);
  resp.set_live_keys(s.live_slots);
  resp.set_keys_evicted(s.evicted_slots);
  resp.set_bytes_held(s.bytes_held());
  resp.set_bytes_full(s.bytes_full());
  resp.set_sequences(s.sequences);
  resp.set_requests_running(scheduler_.running());
  resp.set_requests_waiting(scheduler_.waiting());
  resp.set_page_slots(cache_.shape().page_slots);
  resp.set_prefix_snapshots(cached.snapshots);
  resp.set_prefix_pages(cached.pages);
  return reply(ctx, resp, out);
}

}  // namespace fpa::server
