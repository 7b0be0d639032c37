"""The compressed prefix cache through gRPC and /metrics: a conversation's next turn starts from
the cached state of the last one, gives the tokens of a cold run, and the hits show in usage,
in the fpa_prefix_cache_* series and in vLLM's prefix-cache counters."""
import os

from conftest import REPO, solo_generate, wait_for


def test_next_turn_hits_and_equals_a_cold_run(make_server):
    s = make_server("--prefix-cache", "0.5", "--served-model-name", "fpa-test")
    turn = s.client.tokenize("You are a careful assistant. Tell me about rivers.")
    cached = 0
    for n in range(3):
        r = s.client.generate(turn, max_new_tokens=24)
        assert list(r.token_ids) == solo_generate(turn, max_new_tokens=24)
        # Every turn after the first starts where the previous one ended (its last token was
        # never fed, so it is prefilled with the new text).
        assert r.usage.cached_tokens == cached
        cached = len(turn) + len(r.token_ids) - 1
        turn = turn + list(r.token_ids) + s.client.tokenize(f" And then {n}?")[1:]
    m = s.metrics()
    hits = m["fpa_prefix_cache_hit_tokens_total"]
    assert hits > 0
    assert m['vllm:prefix_cache_hits_total{engine="0",model_name="fpa-test"}'] == hits
    assert m['vllm:prefix_cache_queries_total{engine="0",model_name="fpa-test"}'] == \
        m["fpa_prefix_cache_queried_tokens_total"] > hits
    assert m["fpa_prefix_cache_snapshots"] > 0 and m["fpa_prefix_cache_bytes"] > 0
    # Snapshots hold pages, counted apart: what runs holds none once idle.
    wait_for(lambda: s.client.cache_stats().requests_running == 0)
    m = s.metrics()
    assert m["fpa_cache_bytes_held"] == 0 and m["fpa_prefix_cache_bytes"] > 0


def test_regenerate_with_a_full_share(make_server):
    """The same prompt twice (a client's "regenerate") while the share is full: the first request
    cached prompt + output, the second offers the prompt, a prefix of that state, and room for it
    is made by dropping the longer state on the same path (a use-after-free, seen by the ASan
    daemon, before the fix). Under none a page holds 16 keys of one of the model's 8 streams:
    the 40-token prompt takes 24 pages, prompt + output 32, the share 40."""
    s = make_server("--cache-pages", "100", "--prefix-cache", "0.4")
    prompt = s.client.tokenize("rivers bend around old stones " * 7)[:40]
    assert len(prompt) == 40
    expected = solo_generate(prompt, max_new_tokens=24, policy="none")
    for attempt in range(3):
        r = s.client.generate(prompt, max_new_tokens=24, eviction_policy="none")
        assert list(r.token_ids) == expected, attempt
    m = s.metrics()
    assert m["fpa_prefix_cache_evictions_total"] >= 2
    assert m["fpa_prefix_cache_snapshots"] == 1


def test_cached_pages_are_not_in_use(make_server):
    """What the snapshots hold is reclaimable, so once idle no page counts as in use (as vLLM
    counts its cached blocks): a router reading vllm:kv_cache_usage_perc does not steer away from
    a warm pod."""
    s = make_server("--prefix-cache", "0.5", "--served-model-name", "fpa-test")
    prompt = s.client.tokenize("You are a careful assistant. Tell me about rivers.")
    first = s.client.generate(prompt, max_new_tokens=8)
    again = s.client.generate(prompt + list(first.token_ids), max_new_tokens=8)
    assert again.usage.cached_tokens > 0
    m = s.metrics()
    assert m["fpa_prefix_cache_snapshots"] > 0 and m["fpa_prefix_cache_bytes"] > 0
    assert m["fpa_cache_pages_in_use"] == 0
    assert m['vllm:kv_cache_usage_perc{engine="0",model_name="fpa-test"}'] == 0
    info = [k for k in m if k.startswith("vllm:cache_config_info")]
    assert len(info) == 1 and 'enable_prefix_caching="True"' in info[0]


def test_next_turn_on_a_model_with_a_key_value_shift(make_server):
    """FoX Pro's shifted projections carry a row from one token to the next: a cached state
    carries it too, so the next turn's hit gives a cold run's tokens (refused at start before)."""
    model = os.path.join(REPO, "tests/vectors/hf/fox_pro")
    s = make_server("--prefix-cache", "0.5", model=model)
    turn = [256] + [(i * 29 + 13) % 256 for i in range(36)]
    first = s.client.generate(turn, max_new_tokens=12)
    turn = turn + list(first.token_ids) + [(i * 31 + 7) % 256 for i in range(9)]
    r = s.client.generate(turn, max_new_tokens=12)
    assert r.usage.cached_tokens == 37 + len(first.token_ids) - 1
    assert list(r.token_ids) == solo_generate(turn, model=model, max_new_tokens=12)


def test_on_by_default_and_off_at_zero(server, make_server):
    """As vLLM's, the cache is on without a flag: a conversation's next turn hits; the running
    request's figures do not count the snapshots (a router sees an idle pod as idle), which
    CacheStats reports apart. --prefix-cache 0 turns it off."""
    turn = server.client.tokenize("You are a careful assistant. Tell me about rivers.")
    first = server.client.generate(turn, max_new_tokens=8)
    turn = turn + list(first.token_ids) + server.client.tokenize(" And then?")[1:]
    assert server.client.generate(turn, max_new_tokens=4).usage.cached_tokens > 0
    wait_for(lambda: server.client.cache_stats().requests_running == 0)
    stats = server.client.cache_stats()
    assert stats.prefix_snapshots > 0 and stats.prefix_pages > 0
    assert (stats.sequences, stats.pages_in_use, stats.live_keys, stats.bytes_held) == (0, 0, 0, 0)
    off = make_server("--prefix-cache", "0")
    off.client.generate("Hello there", max_new_tokens=4)
    r = off.client.generate("Hello there, again", max_new_tokens=4)
    assert r.usage.cached_tokens == 0
    assert off.metrics()["fpa_prefix_cache_snapshots"] == 0
    assert off.client.cache_stats().prefix_snapshots == 0


def test_http_usage_reports_cached_tokens(make_server):
    """The OpenAI usage carries what gRPC's does: cached (prefix) tokens in vLLM's
    prompt_tokens_details, preemptions and recomputed tokens."""
    import json
    import urllib.request
    s = make_server("--prefix-cache", "0.5")
    port = s.http_port()

    def usage(prompt):
        req = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/completions",
            json.dumps({"prompt": prompt, "max_tokens": 8}).encode(),
            {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            return json.loads(r.read())["usage"]

    turn = s.client.tokenize("You are a careful assistant. Tell me about rivers.")
    assert usage(turn[:5])["prompt_tokens_details"] == {"cached_tokens": 0}
    r = s.client.generate(turn, max_new_tokens=24)
    u = usage(turn + list(r.token_ids) + s.client.tokenize(" And then?")[1:])
    assert u["prompt_tokens_details"] == {"cached_tokens": len(turn) + len(r.token_ids) - 1}
    assert u["preemptions"] == 0 and u["recomputed_tokens"] == 0
