"""vLLM's metric names, scraped over HTTP from a live server, carry the fpa_* values."""
import re

# vLLM name -> the fpa_* sample with the same value (docs/serving.md, "vLLM names").
SAME_VALUE = {
    "vllm:num_requests_running": "fpa_requests_running",
    "vllm:num_requests_waiting": "fpa_requests_waiting",
    "vllm:prompt_tokens_total": "fpa_prompt_tokens_total",
    "vllm:generation_tokens_total": "fpa_generated_tokens_total",
}
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
        if m and f'model_name="{model}"' in m.group(2):
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
        buckets = {k.split("[")[1].rstrip("]") for k in vllm if k.startswith(name + "_bucket[")}
        assert len(buckets) > 10 and "+Inf" in buckets
        for le in buckets:
            assert vllm[f"{name}_bucket[{le}]"] == fpa[f"{twin}_bucket[{le}]"]
    usage = fpa["fpa_cache_pages_in_use"] / fpa["fpa_cache_pages_total"]
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
