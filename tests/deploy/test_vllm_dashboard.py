"""vLLM's published Grafana dashboard against a live fpa-serve: which series it queries, and
that fpa-serve exports them with the model_name label the dashboard selects on.

The queries are those of vLLM's dashboard at commit 004f771f3a6b49597546b05c7d83686d1e121fa0,
https://github.com/vllm-project/vllm/blob/004f771f3a6b49597546b05c7d83686d1e121fa0/examples/online_serving/prometheus_grafana/grafana.json
(not vendored here; Grafana's macros are substituted)."""
from prometheus_client.parser import text_string_to_metric_families

from deploy_env import promql_metric_names
from live_http import SERVED_NAME, served_metrics

SEL = '{model_name="%s"}' % SERVED_NAME
QUERIES = [
    *[f"histogram_quantile({q}, sum by(le) (rate(vllm:{h}_bucket{SEL}[1m])))"
      for q in (0.99, 0.95, 0.9, 0.5)
      for h in ("e2e_request_latency_seconds", "time_per_output_token_seconds",
                "time_to_first_token_seconds")],
    *[f"rate(vllm:{h}_sum{SEL}[1m]) / rate(vllm:{h}_count{SEL}[1m])"
      for h in ("e2e_request_latency_seconds", "time_per_output_token_seconds",
                "time_to_first_token_seconds")],
    f"rate(vllm:prompt_tokens_total{SEL}[1m])",
    f"rate(vllm:generation_tokens_total{SEL}[1m])",
    f"vllm:num_requests_running{SEL}",
    f"vllm:num_requests_waiting{SEL}",
    f"vllm:gpu_cache_usage_perc{SEL}",
    f"sum by(le) (increase(vllm:request_prompt_tokens_bucket{SEL}[1m]))",
    f"sum by(le) (increase(vllm:request_generation_tokens_bucket{SEL}[1m]))",
    f"sum by(finished_reason) (increase(vllm:request_success_total{SEL}[1m]))",
    f"rate(vllm:request_queue_time_seconds_sum{SEL}[1m])",
    f"rate(vllm:request_prefill_time_seconds_sum{SEL}[1m])",
    f"rate(vllm:request_decode_time_seconds_sum{SEL}[1m])",
    f"rate(vllm:request_max_num_generation_tokens_sum{SEL}[1m])",
]
# The dashboard's model_name variable is label_values({__name__=~"vllm:.*"}, model_name): the
# vllm:* series must carry that label (labelled_samples reads only those).



def labelled_samples(text):
    """{sample name: value} of the samples that carry model_name=SERVED_NAME."""
    return {s.name: s.value for family in text_string_to_metric_families(text)
            for s in family.samples if s.labels.get("model_name") == SERVED_NAME}


def test_every_series_of_the_vllm_dashboard_is_exported(tmp_path):
    parsed = promql_metric_names(QUERIES)
    assert all(not errors for _, errors in parsed), parsed
    wanted = set().union(*(names for names, _ in parsed))
    with served_metrics(tmp_path) as text:
        samples = labelled_samples(text)
    missing = {name for name in wanted if name not in samples}
    assert not missing
    # The panels that do show data show the three completions.
    assert samples["vllm:e2e_request_latency_seconds_count"] == 3
    assert samples["vllm:time_to_first_token_seconds_count"] == 3
    assert samples["vllm:time_per_output_token_seconds_count"] == 15
    assert samples["vllm:generation_tokens_total"] == 18
    assert samples["vllm:gpu_cache_usage_perc"] == samples["vllm:kv_cache_usage_perc"] == 0
    # The per-request panels: three finished requests, 18 tokens generated in all.
    assert samples["vllm:request_prompt_tokens_count"] == 3
    assert samples["vllm:request_generation_tokens_sum"] == 18
    assert samples["vllm:request_decode_time_seconds_count"] == 3
    assert samples["vllm:request_queue_time_seconds_count"] == 3
