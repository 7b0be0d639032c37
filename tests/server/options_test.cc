#include "server/options.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace fpa::server {
namespace {

absl::StatusOr<ServeOptions> parse(std::vector<std::string> args) {
  args.insert(args.begin(), "fpa-serve");
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  return parse_options(static_cast<int>(argv.size()), argv.data());
}

TEST(ParseOptions, DefaultsMatchTheServingContract) {
  absl::StatusOr<ServeOptions> o = parse({});
  ASSERT_TRUE(o.ok());
  EXPECT_EQ(o->model, "models/fpa-v2");
  EXPECT_EQ(o->address, "0.0.0.0:50051");
  EXPECT_EQ(o->metrics_address, "0.0.0.0:9400");
  EXPECT_EQ(o->cache_bytes, 268435456);
  EXPECT_EQ(o->max_batch, 32);
  EXPECT_EQ(o->max_queue, 256);
  EXPECT_FALSE(o->tau.has_value());
  EXPECT_EQ(o->drain_seconds, 30);
  EXPECT_EQ(o->max_connections, 1024);
  EXPECT_EQ(o->handshake_timeout_seconds, 10);
  EXPECT_EQ(o->idle_timeout_seconds, 300);
  EXPECT_EQ(o->keepalive_seconds, 60);
  EXPECT_EQ(o->max_streams_per_connection, 64);
  EXPECT_FALSE(o->prefix_cache.has_value());  // on at kDefaultPrefixCacheShare where it works
}

TEST(ParseOptions, BothValueForms) {
  absl::StatusOr<ServeOptions> o = parse(
      {"--model", "m", "--max-batch=8", "--tau", "12.5", "--cache-pages=100", "--backend", "cpu"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->model, "m");
  EXPECT_EQ(o->max_batch, 8);
  EXPECT_FLOAT_EQ(*o->tau, 12.5f);
  EXPECT_EQ(*o->cache_pages, 100);
  EXPECT_EQ(o->backend, "cpu");
  EXPECT_EQ(o->cpu_weights, "auto");
  EXPECT_EQ(parse({"--model", "m", "--cpu-weights=bf16"})->cpu_weights, "bf16");
  EXPECT_EQ(parse({"--model", "m", "--cpu-weights=int8"})->cpu_weights, "int8");
  EXPECT_EQ(o->kv_dtype, "auto");
  EXPECT_EQ(parse({"--model", "m", "--kv-dtype=bf16"})->kv_dtype, "bf16");
  EXPECT_EQ(parse({"--prefix-cache", "0"})->prefix_cache, 0.0);  // off, said so explicitly
  EXPECT_EQ(parse({"--prefix-cache=0.25"})->prefix_cache, 0.25);
}

TEST(ParseOptions, ErrorsNameTheFlag) {
  struct Case {
    std::vector<std::string> args;
    std::string needle;
  };
  for (const Case& c : std::vector<Case>{{{"--max-batch", "0"}, "--max-batch"},
                                         {{"--max-batch", "x"}, "--max-batch"},
                                         {{"--tau", "-1"}, "--tau"},
                                         {{"--max-connections", "0"}, "--max-connections"},
                                         {{"--idle-timeout-seconds", "nan"}, "--idle-timeout"},
                                         {{"--handshake-timeout-seconds=0"}, "--handshake"},
                                         {{"--backend", "tpu"}, "--backend"},
                                         {{"--cpu-weights", "fp8"}, "--cpu-weights"},
                                         {{"--kv-dtype", "fp16"}, "--kv-dtype"},
                                         {{"--no-such-flag", "1"}, "--no-such-flag"},
                                         {{"--model"}, "--model"},
                                         {{"stray"}, "stray"}}) {
    absl::StatusOr<ServeOptions> o = parse(c.args);
    ASSERT_FALSE(o.ok()) << c.needle;
    EXPECT_EQ(o.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(o.status().message().find(c.needle), std::string::npos) << o.status();
  }
}

TEST(ParseOptions, HelpListsEveryFlag) {
  absl::StatusOr<ServeOptions> o = parse({"--help"});
  ASSERT_TRUE(o.ok());
  EXPECT_TRUE(o->help);
  for (const char* flag : {"--model",
                           "--address",
                           "--metrics-address",
                           "--backend",
                           "--cache-bytes",
                           "--cache-pages",
                           "--page-slots",
                           "--max-batch",
                           "--max-queue",
                           "--max-prompt-tokens",
                           "--max-new-tokens",
                           "--prefill-chunk",
                           "--tau",
                           "--threads",
                           "--drain-seconds",
                           "--max-connections",
                           "--handshake-timeout-seconds",
                           "--idle-timeout-seconds",
                           "--keepalive-seconds",
                           "--max-streams-per-connection"}) {
    EXPECT_NE(usage().find(flag), std::string::npos) << flag;
  }
}

}  // namespace
}  // namespace fpa::server
