"""Generation through the daemon equals the engine's own: solo ModelRunner::generate
(fpa-generate), the PyTorch reference decoder, and the same request alone vs in a batch of 32."""
import concurrent.futures
import json
import math
import os
import re
import sys
import urllib.request

import pytest

from conftest import REPO, TEST_MODEL, fpa_client, solo_generate

pb = fpa_client.pb
PROMPTS = ["Hello", "The pass key is 4711. Remember it.", "a", "x" * 300,
           "There and back again. " * 20, "\u00e9t\u00e9 \u2603"]


@pytest.mark.parametrize("prompt", PROMPTS[:4])
def test_unary_greedy_matches_engine(server, prompt):
    resp = server.client.generate(prompt, max_new_tokens=40)
    assert list(resp.token_ids) == solo_generate(prompt, max_new_tokens=40)
    assert resp.usage.prompt_tokens == len(prompt.encode()) + 1
    assert resp.usage.generated_tokens == len(resp.token_ids)
    expected = (pb.FINISH_REASON_EOS if resp.token_ids[-1] == 257 else pb.FINISH_REASON_LENGTH)
    assert resp.finish_reason == expected


def test_token_id_prompt_and_sampling_match_engine(server):
    ids = [256] + list(b"Sampling is seeded")
    kw = dict(temperature=0.9, top_k=40, top_p=0.9, seed=1234)
    resp = server.client.generate(ids, max_new_tokens=40, **kw)
    assert list(resp.token_ids) == solo_generate(ids, max_new_tokens=40, **kw)
    again = server.client.generate(ids, max_new_tokens=40, **kw)
    assert list(again.token_ids) == list(resp.token_ids)


def test_stream_equals_unary(server):
    prompt = PROMPTS[4]
    unary = server.client.generate(prompt, max_new_tokens=60, logprobs=True)
    msgs = list(server.client.stream(prompt, max_new_tokens=60, logprobs=True))
    final = msgs[-1]
    assert final.finish_reason == unary.finish_reason
    assert final.usage == unary.usage
    assert [t for m in msgs for t in m.token_ids] == list(unary.token_ids)
    assert "".join(m.text for m in msgs) == unary.text
    assert [p for m in msgs for p in m.logprobs] == pytest.approx(list(unary.logprobs))
    assert len(unary.logprobs) == len(unary.token_ids)
    assert all(p <= 0 for p in unary.logprobs)
    assert all(len(m.token_ids) >= 1 for m in msgs[:-1])


def test_text_is_the_utf8_of_the_bytes(server):
    resp = server.client.generate(PROMPTS[5], max_new_tokens=80)
    raw = bytes(t for t in resp.token_ids if t < 256)
    assert resp.text == raw.decode("utf-8", errors="replace")


def test_matches_pytorch_reference(server):
    """Teacher-forced: each greedy token is the argmax of the reference decoder (with eviction
    at the model's tau) wherever the top two logits are not a near tie."""
    sys.path.insert(0, os.path.join(REPO, "train"))
    import torch
    from export import load_model
    from reference import decode_steps

    model = load_model(TEST_MODEL)
    prompt = "There and back again. The grass is green."
    resp = server.client.generate(prompt, max_new_tokens=48)
    prompt_ids = server.client.tokenize(prompt)
    seq = prompt_ids + list(resp.token_ids)
    logits = decode_steps(model, torch.tensor(seq), tau=model.cfg.tau)["logits"]
    checked = 0
    for k, token in enumerate(resp.token_ids):
        row = logits[len(prompt_ids) - 1 + k]
        top2 = torch.topk(row, 2).values
        if top2[0] - top2[1] > 1e-3:
            assert int(torch.argmax(row)) == token, f"generated token {k}"
            checked += 1
    assert checked >= len(resp.token_ids) // 2


def test_stop_sequence(server):
    full = server.client.generate("Hello", max_new_tokens=60)
    ascii_at = [i for i, t in enumerate(full.token_ids) if 33 <= t < 127]
    if not ascii_at:
        pytest.skip("the random model produced no printable ASCII to stop on")
    i = ascii_at[0]
    stop = chr(full.token_ids[i])
    resp = server.client.generate("Hello", max_new_tokens=60, stop=[stop])
    assert resp.finish_reason == pb.FINISH_REASON_STOP
    assert list(resp.token_ids) == list(full.token_ids[:i + 1])
    assert resp.text.endswith(stop)


def test_32_concurrent_streams_equal_solo_runs(server):
    prompts = [f"{i}: " + PROMPTS[i % len(PROMPTS)] * (1 + i % 3) for i in range(32)]
    solo = [list(server.client.generate(p, max_new_tokens=48).token_ids) for p in prompts]
    running = []

    def run(p):
        msgs = list(server.client.stream(p, max_new_tokens=48))
        return [t for m in msgs for t in m.token_ids]

    with concurrent.futures.ThreadPoolExecutor(32) as pool:
        futures = [pool.submit(run, p) for p in prompts]
        while not all(f.done() for f in futures):
            running.append(server.client.cache_stats().requests_running)
        batched = [f.result() for f in futures]
    assert batched == solo
    assert max(running) > 1, "the requests never shared a batch"
    assert solo[0] == solo_generate(prompts[0], max_new_tokens=48)


def test_eviction_policies_per_request(server):
    prompt = "The grass is green. The sky is blue. " * 30
    none = server.client.generate(prompt, max_new_tokens=8, eviction_policy="none")
    fpa = server.client.generate(prompt, max_new_tokens=8, eviction_policy="fpa")
    window = server.client.generate(prompt, max_new_tokens=8, eviction_policy="window",
                                    cache_budget_fraction=0.25)
    assert none.usage.live_fraction == 1.0
    assert fpa.usage.live_fraction < 1.0
    assert window.usage.live_fraction <= 0.3
    assert window.usage.cache_bytes_held < none.usage.cache_bytes_held
    assert list(server.client.generate(prompt, max_new_tokens=8, tau=1e9).token_ids) == \
        list(none.token_ids)


def test_snapkv_and_tova_generate(server):
    prompt = "The grass is green. The sky is blue. " * 30
    for policy, extra in (("snapkv", dict(snapkv_window=16, snapkv_pool=5)), ("tova", {})):
        out = server.client.generate(prompt, max_new_tokens=8, eviction_policy=policy,
                                     cache_budget_fraction=0.25, **extra)
        assert len(out.token_ids) == 8, policy
        assert out.usage.live_fraction <= 0.3, policy


def test_tokenize_and_model_info(server):
    assert server.client.tokenize("h\u00e9") == [256, 104, 0xC3, 0xA9]
    info = server.client.model_info()
    assert (info.attention, info.levels, info.n_layers, info.vocab_size) == ("fpa", "free", 2, 259)
    assert info.tau == pytest.approx(3.5)
    assert info.backend == "cpu"
    assert '"fpa-serve/1"' in info.config_json


def has_avx512_bf16():
    with open("/proc/cpuinfo") as f:
        return "avx512_bf16" in f.read()


@pytest.mark.skipif(not has_avx512_bf16(), reason="no AVX512-BF16 on this CPU")
def test_bf16_weights(server, make_server):
    """--cpu-weights bf16 serves, says so, and greedy decoding mostly agrees with float32 (bf16
    moves the logits by well under 1%, which can flip a near tie)."""
    s = make_server("--cpu-weights", "bf16")
    assert s.client.model_info().backend == "cpu-bf16"
    prompt = "The pass key is 4821. Remember it. " * 3
    ours = list(s.client.generate(prompt, max_new_tokens=24, ignore_eos=True).token_ids)
    f32 = list(server.client.generate(prompt, max_new_tokens=24, ignore_eos=True).token_ids)
    assert len(ours) == 24
    agree = next((i for i, (a, b) in enumerate(zip(ours, f32)) if a != b), len(ours))
    assert agree >= 4, (ours, f32)


def test_bf16_kv_cache(server, make_server):
    """--kv-dtype bf16 stores keys and values in half the bytes (the usage report and the metrics
    count the real storage: 2*head_dim*2 + 16 bytes a key against 2*head_dim*4 + 16) and greedy
    decoding mostly agrees with float32 pages."""
    s = make_server("--kv-dtype", "bf16")
    prompt = "The pass key is 4821. Remember it. " * 3
    ours = s.client.generate(prompt, max_new_tokens=24, ignore_eos=True, eviction_policy="none")
    f32 = server.client.generate(prompt, max_new_tokens=24, ignore_eos=True,
                                 eviction_policy="none")
    d = s.client.model_info().head_dim
    ratio = ours.usage.cache_bytes_full / f32.usage.cache_bytes_full
    assert ratio == pytest.approx((4 * d + 16) / (8 * d + 16))
    assert ours.usage.cache_bytes_held < f32.usage.cache_bytes_held
    agree = next((i for i, (a, b) in enumerate(zip(ours.token_ids, f32.token_ids)) if a != b),
                 len(ours.token_ids))
    assert agree >= 4, (list(ours.token_ids), list(f32.token_ids))


def test_health(server):
    assert server.client.health("") == "SERVING"
    assert server.client.health("fpa.v1.FpaService") == "SERVING"
    import grpc
    with pytest.raises(grpc.RpcError) as e:
        server.client.health("no.such.Service")
    assert e.value.code() == grpc.StatusCode.NOT_FOUND


def test_reflection_lists_the_service(server):
    """grpc.reflection.v1alpha.ServerReflection, spoken in raw protobuf: the request sets field 7
    (list_services) to ""; the answer names the services."""
    import grpc
    with grpc.insecure_channel(server.address) as channel:
        call = channel.stream_stream(
            "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
            request_serializer=lambda b: b, response_deserializer=lambda b: b)
        replies = list(call(iter([b"\x3a\x00"]), timeout=10))
    assert b"fpa.v1.FpaService" in replies[0]
    assert b"grpc.health.v1.Health" in replies[0]


def test_shipped_model_matches_engine(make_server):
    """The default model, models/fpa-v2, through the daemon equals solo generation (float32, as
    fpa-generate runs it: the model's config lets --cpu-weights auto pick int8)."""
    model = os.path.join(REPO, "models", "fpa-v2")
    if not os.path.exists(os.path.join(model, "model.safetensors")):
        pytest.skip("models/fpa-v2 is not trained yet")
    s = make_server("--cpu-weights", "f32", "--kv-dtype", "f32", model=model)
    prompt = "There is an important info hidden inside a lot of irrelevant text. The pass key is"
    resp = s.client.generate(prompt, max_new_tokens=24)
    assert list(resp.token_ids) == solo_generate(prompt, model=model, max_new_tokens=24)


def test_command_line_client(server):
    import json
    import subprocess
    cli = [sys.executable, os.path.join(REPO, "client", "fpa_client.py"), "--address",
           server.address]

    def run(*args):
        out = subprocess.run(cli + list(args), check=True, capture_output=True, text=True,
                             timeout=60)
        return out.stdout

    unary = json.loads(run("generate", "Hello", "--max-new-tokens", "12", "--json"))
    lines = run("generate", "Hello", "--max-new-tokens", "12", "--stream", "--json").splitlines()
    streamed = [json.loads(line) for line in lines]
    assert [t for m in streamed for t in m.get("tokenIds", [])] == unary["tokenIds"]
    assert streamed[-1]["finishReason"] == unary["finishReason"]
    assert unary["tokenIds"] == solo_generate("Hello", max_new_tokens=12)
    assert json.loads(run("tokenize", "hi")) == [256, 104, 105]
    assert run("health").strip() == "SERVING"
    bad = subprocess.run(cli + ["generate", "x", "--top-p", "2"], capture_output=True, text=True,
                         timeout=60)
    assert bad.returncode == 1 and "INVALID_ARGUMENT: top_p" in bad.stderr


def test_top_logprobs_and_prompt_logprobs_over_grpc(server):
    """vLLM's top_logprobs and prompt scoring through gRPC: alternatives likeliest first, the
    sampled token's log-probability among them when it is the greedy one; a scored prompt with
    max_new_tokens 0 generates nothing."""
    r = server.client.generate("The sky is", max_new_tokens=6, temperature=0, logprobs=True,
                               top_logprobs=3)
    assert len(r.top_logprobs) == len(r.token_ids) == 6
    for token, lp, top in zip(r.token_ids, r.logprobs, r.top_logprobs):
        assert len(top.token_ids) == 3 and list(top.logprobs) == sorted(top.logprobs, reverse=True)
        assert top.token_ids[0] == token and abs(top.logprobs[0] - lp) < 1e-6  # greedy
    prompt = [256] + list(b"The sky is")
    scored = server.client.generate(prompt, max_new_tokens=0, prompt_logprobs=True,
                                    top_logprobs=2, eviction_policy="none")
    assert scored.usage.generated_tokens == 0 and not scored.token_ids
    assert len(scored.prompt_logprobs) == len(prompt) == len(scored.prompt_top_logprobs)
    assert math.isnan(scored.prompt_logprobs[0])
    assert all(x <= 0 for x in scored.prompt_logprobs[1:])
    # Position i's alternatives predict prompt token i: their best is at least its logprob.
    for lp, top in zip(scored.prompt_logprobs[1:], scored.prompt_top_logprobs[1:]):
        assert top.logprobs[0] >= lp - 1e-6


def test_formats_are_reported(make_server):
    """ModelInfo and /v1/models say which CPU formats the server runs: an explicit choice as
    given, auto as picked (float32 for a model whose config lists no measured formats)."""
    s = make_server("--cpu-weights", "auto", "--kv-dtype", "bf16")
    info = s.client.model_info()
    assert (info.cpu_weights, info.kv_dtype) == ("f32", "bf16")
    port = re.search(r":(\d+) \(http\)", s.output()).group(1)
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=10) as r:
        model = json.loads(r.read())["data"][0]
    assert (model["cpu_weights"], model["kv_dtype"]) == ("f32", "bf16")
    assert "cpu weights f32 (--cpu-weights auto), kv pages bf16" in s.output()
