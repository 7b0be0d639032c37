"""bench/passkey.py end to end against a live fpa-serve on the shipped model, so it cannot rot.

One length (1x the training length), a few samples, the full cache, the learned rule and one
heuristic at the budget fpa reached and at 25%. It checks the harness's records, not the model's
skill: every run came back, the budgets hold, the full cache holds everything.
"""
from __future__ import annotations

import json
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "tests", "server"))
sys.path.insert(0, os.path.join(REPO, "bench"))
from daemon import Server  # noqa: E402
import passkey  # noqa: E402

MODEL = os.path.join(REPO, "models", "fpa-tiny")
STUBS = os.environ.get("FPA_PY_STUBS", os.path.join(REPO, "build", "proto", "python"))


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    server = Server("--max-prompt-tokens", "8192", model=MODEL)
    out = tmp_path_factory.mktemp("passkey") / "run.json"
    try:
        assert passkey.main(["--address", server.address, "--stubs", STUBS, "--lengths", "1",
                             "--depths", "0.3,0.7", "--samples", "1", "--policies",
                             "none,fpa,window", "--budgets", "auto,0.25", "--time-limit", "300",
                             "--json", str(out)]) == 0
    finally:
        server.stop()
    run = json.loads(out.read_text())
    assert not run["truncated"]
    return run["records"]


def by(records, policy, budget=None):
    return [r for r in records if r["policy"] == policy and r["budget"] == budget]


def test_every_run_came_back(records):
    assert len(by(records, "none")) == 2
    assert len(by(records, "fpa")) == 2
    assert len(by(records, "window", "0.25")) == 2
    for r in records:
        assert r["answer"] is None or r["answer"].isdigit()
        assert r["correct"] == (r["answer"] == r["key"])
        assert r["bytes_full"] > 0


def test_full_cache_holds_every_key(records):
    for r in by(records, "none"):
        assert r["live_fraction"] == pytest.approx(1.0)
        assert r["held_fraction"] >= 1.0  # partly filled pages count whole


def test_fpa_evicts_and_auto_budget_matches_it(records):
    fpa = by(records, "fpa")
    assert all(r["live_fraction"] < 1.0 for r in fpa), "the shipped model should evict"
    auto = by(records, "window", "auto")
    assert len(auto) == 2
    mean_fpa = sum(r["held_fraction"] for r in fpa) / len(fpa)
    assert all(r["budget_fraction"] == pytest.approx(mean_fpa, abs=1e-3) for r in auto)


def test_heuristic_holds_its_budget(records):
    for r in by(records, "window", "0.25"):
        # One partly filled page per head on top of the budget, at most.
        slack = 16 / r["length"] + 0.01
        assert r["live_fraction"] <= 0.25 + slack
        assert r["held_fraction"] <= 0.25 + slack
