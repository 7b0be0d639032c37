"""/metrics, scraped over HTTP, moves as requests run."""
import time

import pytest

NAMES = ["fpa_cache_pages", "fpa_cache_pages_in_use", "fpa_cache_live_keys",
         "fpa_cache_keys_evicted_total", "fpa_cache_bytes_held", "fpa_cache_bytes_full",
         "fpa_cache_bytes_saved", "fpa_request_live_fraction_count", "fpa_requests_running",
         "fpa_requests_waiting", "fpa_time_to_first_token_seconds_count",
         "fpa_inter_token_latency_seconds_count", "fpa_request_duration_seconds_count",
         "fpa_prompt_tokens_total", "fpa_generated_tokens_total"]


def test_every_documented_metric_is_exported(server):
    m = server.metrics()
    missing = [n for n in NAMES if n not in m]
    assert not missing
    assert m["fpa_cache_pages"] == 16384


def test_metrics_move_with_a_long_prompt(server):
    before = server.metrics()
    prompt = "The grass is green. The sky is blue. The sun is yellow. " * 30
    resp = server.client.generate(prompt, max_new_tokens=20)
    after = server.metrics()

    def delta(name):
        return after[name] - before.get(name, 0)

    assert delta("fpa_cache_keys_evicted_total") > 0
    assert delta("fpa_prompt_tokens_total") == resp.usage.prompt_tokens
    assert delta("fpa_generated_tokens_total") == resp.usage.generated_tokens
    assert delta('fpa_requests_total{code="OK"}') == 1
    assert delta("fpa_time_to_first_token_seconds_count") == 1
    assert delta("fpa_inter_token_latency_seconds_count") == resp.usage.generated_tokens - 1
    assert delta("fpa_request_duration_seconds_count") == 1
    assert delta("fpa_request_live_fraction_count") == 1
    assert delta("fpa_request_live_fraction_sum") == pytest.approx(resp.usage.live_fraction)
    assert resp.usage.live_fraction < 1
    assert resp.usage.cache_bytes_held < resp.usage.cache_bytes_full
    # Idle again: the pages are back (freed before the response was sent).
    assert after["fpa_cache_pages_in_use"] == 0
    assert after["fpa_cache_live_keys"] == 0 and after["fpa_cache_bytes_held"] == 0
    # The batch gauges follow at the end of the scheduler's iteration.
    deadline = time.time() + 5
    while server.metrics()["fpa_requests_running"] != 0:
        assert time.time() < deadline
        time.sleep(0.01)
    assert server.metrics()["fpa_requests_waiting"] == 0


def test_bytes_saved_while_a_request_runs(server):
    call = server.client.stream("The sky is blue. " * 60, max_new_tokens=5000, ignore_eos=True)
    next(call)
    m = server.metrics()
    call.cancel()
    assert m["fpa_requests_running"] == 1
    assert m["fpa_cache_pages_in_use"] > 0
    assert m["fpa_cache_bytes_saved"] == m["fpa_cache_bytes_full"] - m["fpa_cache_bytes_held"]
    assert m["fpa_cache_bytes_full"] > 0


def test_invalid_requests_are_counted(server):
    before = server.metrics().get('fpa_requests_total{code="INVALID_ARGUMENT"}', 0)
    with pytest.raises(Exception):
        server.client.generate("x", top_p=2.0)
    after = server.metrics()['fpa_requests_total{code="INVALID_ARGUMENT"}']
    assert after == before + 1
