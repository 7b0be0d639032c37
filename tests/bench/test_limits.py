"""The limit bench/llama_cpp_compare.py holds each side to: a decode step's least time, from
reading its weights or computing their products (whichever is longer), then reading the keys and
values."""
import os
import sys
from types import SimpleNamespace

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
import llama_cpp_compare as compare  # noqa: E402

# A machine reading 100 GB/s past a 32 MiB cache, and int8 products at 1000 GOP/s.
LIM = {"cpu": {"l3_bytes": 32 << 20}, "read_gbps": {"1024": 100.0},
       "gflops": {"f32": 250.0, "bf16": 500.0, "int8": 1000.0}}
SIZE = (10**9, 2048)  # a billion parameters, 2048 key elements a token


def run(batch: int, tokens_per_s: float) -> dict:
    return {"cpu_weights": "int8", "kv_dtype": "bf16", "batch": batch, "context": 512,
            "tokens_per_s": tokens_per_s}


def test_one_token_is_held_to_reading_the_step():
    wbytes, kvbytes = compare.step_bytes(SIZE, "ours softmax", run(1, 1), steps=0)
    assert (wbytes, kvbytes) == (1e9, 2 * 2048 * 512 * 2)
    seconds, products = compare.step_limit(SIZE, "ours softmax", run(1, 1), 0, LIM)
    assert seconds == pytest.approx((wbytes + kvbytes) / 100e9) and not products


def test_products_bound_the_weights_once_they_take_longer_than_reading_them():
    # 64 tokens: 128 GOP of products (0.128 s) against 1 GB of weights read in 0.01 s.
    r = run(64, 1)
    seconds, products = compare.step_limit(SIZE, "ours softmax", r, 0, LIM)
    kvbytes = compare.step_bytes(SIZE, "ours softmax", r, 0)[1]
    assert products and seconds == pytest.approx(0.128 + kvbytes / 100e9)
    # A side running exactly at that bound is at 1.0 of its limit.
    r["tokens_per_s"] = 64 / seconds
    assert compare.decode_fraction(SIZE, "ours softmax", r, 0, LIM) == pytest.approx(1.0)


def test_the_dram_rate_beside_the_run_scales_a_step_past_the_cache():
    r = run(1, 1)
    slow = dict(r, dram_gbps=[40.0, 60.0])
    assert (compare.step_limit(SIZE, "ours softmax", slow, 0, LIM)[0]
            == pytest.approx(2 * compare.step_limit(SIZE, "ours softmax", r, 0, LIM)[0]))


def test_phase_table_gives_each_phase_its_read_rate():
    # A step whose attention read its keys and values at 25 GB/s and its products the weights at
    # 30 GB/s (the mlp phase alone: the other product phases took no time).
    r = run(8, 1)
    wbytes, kvbytes = compare.step_bytes(compare.sizes("1b"), "ours softmax", r, 0)
    r["phase_ms"] = {"project": 0.0, "field": 0.5, "pages": 0.25, "attend": kvbytes / 25e6,
                     "cache": 1.0, "output": 0.0, "mlp": wbytes / 30e6, "logits": 0.0}
    r["dram_gbps"] = [33.0, 35.0]
    r["run_cpu_stolen"] = 0.25
    row = {"shape": "1b", "batch": 8, "context": 512, "sides": {"ours softmax": r}}
    lines = compare.phase_table([row], SimpleNamespace(steps=0))
    assert len(lines) == 3  # the header, its rule, the one side that has phases
    cells = [c.strip() for c in lines[2].strip("|").split("|")]
    assert cells[4].endswith("(25.0)") and cells[5].endswith("(30.0)")
    assert cells[6:] == ["1.0", "0.8", "34.0", "25%"]


def test_cpu_stolen_is_the_share_of_all_ticks_the_host_took(monkeypatch):
    ticks = iter([(100, 1000), (130, 1200)])
    monkeypatch.setattr(compare, "cpu_ticks", lambda: next(ticks))
    assert compare.stolen_since(compare.cpu_ticks()) == pytest.approx(30 / 200)
    assert compare.stolen_since(None) is None


def test_this_machines_ticks_are_read():
    ticks = compare.cpu_ticks()
    if not os.path.exists("/proc/stat"):
        assert ticks is None
        return
    assert ticks is not None and 0 <= ticks[0] <= ticks[1]


def test_a_run_the_host_took_too_much_cpu_from_is_run_again(monkeypatch):
    # Ticks (stolen, all) read before and after each run: 40% stolen, then 2%.
    ticks = iter([(0, 0), (40, 100), (40, 100), (42, 200)])
    monkeypatch.setattr(compare, "cpu_ticks", lambda: next(ticks))
    monkeypatch.setattr(compare, "dram_gbps", lambda bench, threads: 30.0)
    runs = []
    a = SimpleNamespace(bench="b", threads=2, max_stolen=0.05, stolen_retries=2)
    r = compare.beside_machine(lambda: runs.append(1) or {"tokens_per_s": len(runs)}, a)
    assert len(runs) == 2 and r["tokens_per_s"] == 2
    assert r["run_cpu_stolen"] == pytest.approx(0.02) and r["dram_gbps"] == [30.0, 30.0]
    # With no retries left, the stolen run is kept and its share reported.
    ticks = iter([(0, 0), (40, 100)])
    runs.clear()
    r = compare.beside_machine(lambda: runs.append(1) or {}, SimpleNamespace(
        bench="b", threads=2, max_stolen=0.05, stolen_retries=0))
    assert len(runs) == 1 and r["run_cpu_stolen"] == pytest.approx(0.4)
