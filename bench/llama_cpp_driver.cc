// llama.cpp's side of bench/llama_cpp_compare.py: loads a GGUF written by bench/gguf_write.py
// through libllama (the prebuilt libraries of the npm package @node-llama-cpp/linux-x64) and
// either prints logits or measures decode and prefill the way bench/decode_bench.cc does (the same
// token streams, timing windows and JSON fields). Not part of the CMake build: the compare script
// compiles it against the package's libraries and llama.cpp's headers of the same release.
//   llama-driver --lib DIR --model M.gguf logits 256,72,101 OUT.f32
//   llama-driver --lib DIR --model M.gguf [--flash on] [--cache f16] bench --batch 1,8
//       --context 512 [--steps 64 --windows 4 --threads 2]
#include <dirent.h>
#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "bench/decode_tokens.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "llama.h"

namespace {

using Clock = std::chrono::steady_clock;

[[noreturn]] void die(const std::string& msg) {
  std::fprintf(stderr, "llama-driver: %s\n", msg.c_str());
  std::exit(1);
}

std::vector<int> ints(const std::string& list) {
  std::vector<int> out;
  for (size_t at = 0; at <= list.size();) {
    const size_t end = std::min(list.find(',', at), list.size());
    out.push_back(std::atoi(list.substr(at, end - at).c_str()));
    at = end + 1;
  }
  return out;
}

// The libggml-cpu-<microarchitecture>.so with the highest ggml_backend_score() on this CPU (0 =
// it cannot run here): what ggml_backend_load_best() picks, done here to name the variant.
std::string best_cpu_variant(const std::string& dir) {
  DIR* d = opendir(dir.c_str());
  if (!d) die("no library directory " + dir);
  std::string best;
  int best_score = 0;
  while (const dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (name.rfind("libggml-cpu-", 0) != 0) continue;
    void* h = dlopen((dir + "/" + name).c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!h) continue;
    auto score = reinterpret_cast<int (*)()>(dlsym(h, "ggml_backend_score"));
    const int s = score ? score() : 0;
    if (s > best_score) best_score = s, best = name;
    dlclose(h);
  }
  closedir(d);
  if (best.empty()) die("no CPU variant of ggml runs on this CPU");
  return best;
}

struct Options {
  std::string lib, model, mode;
  std::vector<std::string> args;
  bool flash = false;
  ggml_type cache = GGML_TYPE_F32;
  std::vector<int> batch{1}, context{512};
  int steps = 64, windows = 4, threads = 2, chunk = 512;
  // ggml's default: workers spin a while for the next graph before sleeping. With 0 they sleep at
  // once, and on this shared machine decode steps took 400 ms instead of 0.25 ms.
  int poll = 50;
};

Options parse(int argc, char** argv) {
  Options o;
  auto num = [](int& field) {
    return [&field](const std::string& v) { field = std::atoi(v.c_str()); };
  };
  const std::map<std::string, std::function<void(const std::string&)>> flags = {
      {"--lib", [&](const std::string& v) { o.lib = v; }},
      {"--model", [&](const std::string& v) { o.model = v; }},
      {"--flash", [&](const std::string& v) { o.flash = v == "on"; }},
      {"--cache",
       [&](const std::string& v) { o.cache = v == "f16" ? GGML_TYPE_F16 : GGML_TYPE_F32; }},
      {"--batch", [&](const std::string& v) { o.batch = ints(v); }},
      {"--context", [&](const std::string& v) { o.context = ints(v); }},
      {"--steps", num(o.steps)},
      {"--windows", num(o.windows)},
      {"--threads", num(o.threads)},
      {"--prefill-chunk", num(o.chunk)},
      {"--poll", num(o.poll)},
  };
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (auto f = flags.find(a); f != flags.end()) {
      if (i + 1 >= argc) die(a + " needs a value");
      f->second(argv[++i]);
    } else if (o.mode.empty()) {
      o.mode = a;
    } else {
      o.args.push_back(a);
    }
  }
  if (o.lib.empty() || o.model.empty() || (o.mode != "logits" && o.mode != "bench"))
    die("usage: --lib DIR --model M.gguf (logits TOKENS OUT | bench [--batch ..])");
  if (o.steps < 1 || o.windows < 1 || o.threads < 1 || o.chunk < 1) die("bad counts");
  return o;
}

// The CPU backend plus a persistent threadpool: without one attached, ggml starts and joins its
// threads at every llama_decode and step times scatter by 100x on a busy machine.
struct Runtime {
  std::string variant;
  ggml_threadpool* pool = nullptr;
};

Runtime start(const Options& o) {
  Runtime rt{best_cpu_variant(o.lib)};
  ggml_backend_reg_t reg = ggml_backend_load((o.lib + "/" + rt.variant).c_str());
  if (!reg) die("cannot load " + rt.variant);
  llama_backend_init();
  auto make = reinterpret_cast<ggml_threadpool* (*)(ggml_threadpool_params*)>(
      ggml_backend_reg_get_proc_address(reg, "ggml_threadpool_new"));
  if (!make) die(rt.variant + " has no ggml_threadpool_new");
  ggml_threadpool_params p = ggml_threadpool_params_default(o.threads);
  p.poll = o.poll;
  rt.pool = make(&p);
  if (!rt.pool) die("ggml_threadpool_new failed");
  return rt;
}

llama_context* make_context(llama_model* model, const Runtime& rt, const Options& o, int seqs,
                            int cells) {
  llama_context_params cp = llama_context_default_params();
  cp.n_seq_max = seqs;
  cp.n_ctx = seqs * ((cells + 255) / 256 * 256);
  cp.n_batch = cp.n_ubatch = std::max(o.chunk, seqs);
  cp.n_threads = cp.n_threads_batch = o.threads;
  cp.flash_attn_type = o.flash ? LLAMA_FLASH_ATTN_TYPE_ENABLED : LLAMA_FLASH_ATTN_TYPE_DISABLED;
  cp.type_k = cp.type_v = o.cache;
  cp.kv_unified = false;  // one stream per sequence: each reads only its own keys, as ours do
  cp.no_perf = true;
  llama_context* ctx = llama_init_from_model(model, cp);
  if (!ctx) die("llama_init_from_model failed");
  llama_attach_threadpool(ctx, rt.pool, rt.pool);
  return ctx;
}

// One llama_decode of tokens[i] at positions pos0 + i of sequence seq (all logits or the last).
void decode(llama_context* ctx, llama_batch& b, const std::vector<llama_token>& tokens,
            const std::vector<int>& seqs, const std::vector<int>& pos, bool all_logits) {
  b.n_tokens = static_cast<int>(tokens.size());
  for (int i = 0; i < b.n_tokens; ++i) {
    b.token[i] = tokens[i];
    b.pos[i] = pos[i];
    b.n_seq_id[i] = 1;
    b.seq_id[i][0] = seqs[i];
    b.logits[i] = all_logits || i + 1 == b.n_tokens;
  }
  if (llama_decode(ctx, b) != 0) die("llama_decode failed");
  llama_synchronize(ctx);
}

// Logits of every position of one sequence, float32 [T, vocab], written raw to a file.
void logits(llama_model* model, const Runtime& rt, Options o) {
  if (o.args.size() != 2) die("logits TOKENS OUT");
  const std::vector<int> tokens = ints(o.args[0]);
  const int n = static_cast<int>(tokens.size());
  o.chunk = std::max(o.chunk, n);
  llama_context* ctx = make_context(model, rt, o, 1, n);
  llama_batch b = llama_batch_init(n, 0, 1);
  std::vector<int> seqs(n, 0), pos(n);
  for (int i = 0; i < n; ++i) pos[i] = i;
  decode(ctx, b, {tokens.begin(), tokens.end()}, seqs, pos, true);
  const int v = llama_vocab_n_tokens(llama_model_get_vocab(model));
  FILE* f = std::fopen(o.args[1].c_str(), "wb");
  if (!f) die("cannot write " + o.args[1]);
  for (int i = 0; i < n; ++i) std::fwrite(llama_get_logits_ith(ctx, i), sizeof(float), v, f);
  std::fclose(f);
  llama_batch_free(b);
  llama_free(ctx);
}

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Sequence 0 prefilled with the shared prompt in chunks (timed), then copied to the others.
double prefill(llama_context* ctx, llama_batch& b, int batch, int context, int chunk) {
  const auto t0 = Clock::now();
  for (int at = 0; at < context; at += chunk) {
    std::vector<llama_token> tokens;
    std::vector<int> pos;
    for (int p = at; p < std::min(context, at + chunk); ++p) {
      tokens.push_back(fpa::bench::bench_token(0, p));
      pos.push_back(p);
    }
    decode(ctx, b, tokens, std::vector<int>(tokens.size(), 0), pos, false);
  }
  const double secs = seconds_since(t0);
  for (int s = 1; s < batch; ++s) llama_memory_seq_cp(llama_get_memory(ctx), 0, s, -1, -1);
  return secs;
}

void bench_one(llama_model* model, const Runtime& rt, const Options& o, int batch, int context) {
  llama_context* ctx = make_context(model, rt, o, batch, context + o.steps);
  llama_batch b = llama_batch_init(std::max(o.chunk, batch), 0, 1);
  const double prefill_secs = prefill(ctx, b, batch, context, o.chunk);
  std::vector<int> seqs(batch);
  for (int s = 0; s < batch; ++s) seqs[s] = s;
  const int windows = std::min(o.windows, o.steps);
  double best = 1e300, total = 0;
  for (int w = 0, i = 0; w < windows; ++w) {
    const int begin = i, end = o.steps * (w + 1) / windows;
    const auto t0 = Clock::now();
    for (; i < end; ++i) {
      std::vector<llama_token> tokens;
      for (int s = 0; s < batch; ++s) tokens.push_back(fpa::bench::bench_token(s, context + i));
      decode(ctx, b, tokens, seqs, std::vector<int>(batch, context + i), true);
    }
    const double secs = seconds_since(t0);
    best = std::min(best, secs / (end - begin));
    total += secs;
  }
  std::printf(
      "{\"impl\":\"llama.cpp\",\"cpu_variant\":\"%s\",\"flash\":%s,\"cache\":\"%s\","
      "\"batch\":%d,\"context\":%d,\"steps\":%d,\"seconds\":%.6f,\"tokens_per_s\":%.3f,"
      "\"tokens_per_s_mean\":%.3f,\"prefill_tokens_per_s\":%.3f}\n",
      rt.variant.c_str(), o.flash ? "true" : "false", o.cache == GGML_TYPE_F16 ? "f16" : "f32",
      batch, context, o.steps, total, batch / best, batch * o.steps / total,
      context / prefill_secs);
  std::fflush(stdout);
  llama_batch_free(b);
  llama_free(ctx);
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  llama_log_set(
      [](ggml_log_level level, const char* text, void*) {
        if (level >= GGML_LOG_LEVEL_WARN) std::fputs(text, stderr);
      },
      nullptr);
  const Runtime rt = start(o);
  llama_model_params mp = llama_model_default_params();
  llama_model* model = llama_model_load_from_file(o.model.c_str(), mp);
  if (!model) die("cannot load " + o.model);
  if (o.mode == "logits") {
    logits(model, rt, o);
  } else {
    for (int context : o.context) {
      for (int batch : o.batch) bench_one(model, rt, o, batch, context);
    }
  }
  llama_model_free(model);
  return 0;
}
