"""vLLM's metric names, scraped over HTTP from a live server, carry the fpa_* values."""
import re

from daemon import wait_for

# vLLM name -> the fpa_* sample with the same value (docs/serving.md, "vLLM names").
SAME_VALUE = {
    "vllm:num_requests_running": "fpa_requests_running",
    "vllm:num_requests_waiting": "fpa_requests_waiting",
    "vllm:prompt_tokens_total": "fpa_prompt_tokens_total",
    "vllm:generation_tokens_total": "fpa_generated_tokens_total",
    "vllm:num_preemptions_total": "fpa_preemptions_total",
}
# vLLM's bucket boundaries (https://github.com/vllm-project/vllm/blob/main/vllm/v1/metrics/loggers.py), +Inf aside.
VLLM_BUCKETS = {
    "vllm:time_to_first_token_seconds": [
        0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
        10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0],
    "vllm:inter_token_latency_seconds": [
        0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
        20.0, 40.0, 80.0],
    "vllm:e2e_request_latency_seconds": [
        0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
        240.0, 480.0, 960.0, 1920.0, 7680.0],
}
VLLM_BUCKETS["vllm:time_per_output_token_seconds"] = VLLM_BUCKETS["vllm:inter_token_latency_seconds"]
for name in ("queue_time", "prefill_time", "decode_time"):
    VLLM_BUCKETS[f"vllm:request_{name}_seconds"] = VLLM_BUCKETS["vllm:e2e_request_latency_seconds"]
HISTOGRAMS = {
    "vllm:time_to_first_token_seconds": "fpa_time_to_first_token_seconds",
    "vllm:inter_token_latency_seconds": "fpa_inter_token_latency_seconds",
    "vllm:time_per_output_token_seconds": "fpa_inter_token_latency_seconds",
    "vllm:e2e_request_latency_seconds": "fpa_request_duration_seconds",
}


def vllm_series(metrics: dict[str, float], model: str) -> dict[str, float]:
    """The vllm:* samples labelled with `model`, by name (histogram buckets keyed by le)."""
    out = {}
    for key, value in metrics.items():
        m = re.fullmatch(r"(vllm:[\w:]+)\{(.*)\}", key)
        if m and f'model_name="{model}"' in m.group(2) and 'engine="0"' in m.group(2):
            le = re.search(r'le="([^"]+)"', m.group(2))
            out[m.group(1) + (f"[{le.group(1)}]" if le else "")] = value
    return out


def fpa_series(metrics: dict[str, float]) -> dict[str, float]:
    out = {}
    for key, value in metrics.items():
        le = re.search(r'le="([^"]+)"', key)
        out[key.split("{")[0] + (f"[{le.group(1)}]" if le else "")] = value
    return out


def test_vllm_names_equal_the_fpa_ones_after_requests(server):
    server.client.generate("The grass is green. " * 20, max_new_tokens=12)
    server.client.generate("The sky is blue.", max_new_tokens=5, temperature=0.7, seed=3)
    m = server.metrics()
    vllm, fpa = vllm_series(m, "fpa_free"), fpa_series(m)
    for name, twin in SAME_VALUE.items():
        assert vllm[name] == fpa[twin], name
    assert fpa["fpa_generated_tokens_total"] >= 17
    for name, twin in HISTOGRAMS.items():
        for part in ("_count", "_sum"):
            assert vllm[name + part] == fpa[twin + part], name + part
    for name, want in VLLM_BUCKETS.items():
        buckets = [k.split("[")[1].rstrip("]") for k in vllm if k.startswith(name + "_bucket[")]
        assert sorted(float(le) for le in buckets if le != "+Inf") == want, name
        assert "+Inf" in buckets, name
    usage = fpa["fpa_cache_pages_in_use"] / fpa["fpa_cache_pages"]
    assert vllm["vllm:kv_cache_usage_perc"] == usage
    assert vllm["vllm:gpu_cache_usage_perc"] == usage


def test_kv_cache_usage_follows_the_pages_in_use(server):
    call = server.client.stream("The sky is blue. " * 60, max_new_tokens=5000, ignore_eos=True)
    next(call)
    m = server.metrics()
    call.cancel()
    vllm = vllm_series(m, "fpa_free")
    assert m["fpa_cache_pages_in_use"] > 0
    assert vllm["vllm:kv_cache_usage_perc"] == m["fpa_cache_pages_in_use"] / 16384
    assert vllm["vllm:num_requests_running"] == m["fpa_requests_running"] == 1


def test_served_model_name_labels_the_series(make_server):
    s = make_server("--served-model-name", "my-model")
    m = s.metrics()
    assert vllm_series(m, "my-model")["vllm:num_requests_waiting"] == 0
    assert not vllm_series(m, "fpa_free")


def test_cache_config_info_and_the_renamed_pages_gauge(server):
    m = server.metrics()
    info = [k for k in m if k.startswith("vllm:cache_config_info{")]
    assert len(info) == 1 and m[info[0]] == 1
    for label in ('engine="0"', 'block_size="16"', f'num_gpu_blocks="{int(m["fpa_cache_pages"])}"',
                  'cache_dtype="float32"', 'enable_prefix_caching="True"'):  # on by default
        assert label in info[0], (label, info[0])
    # The old name (a gauge ending in _total) is kept one release beside the new one.
    assert m["fpa_cache_pages_total"] == m["fpa_cache_pages"] == 16384


def test_cancelled_requests_count_as_aborted(server):
    key = 'vllm:request_success_total{engine="0",finished_reason="abort",model_name="fpa_free"}'
    before = server.metrics().get(key, 0)
    call = server.client.stream("Cancel me. " * 20, max_new_tokens=5000, ignore_eos=True)
    next(call)
    call.cancel()
    wait_for(lambda: server.metrics().get(key, 0) == before + 1, timeout=5)
