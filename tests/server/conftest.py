"""Fixtures that run the real fpa-serve on loopback ports and always stop it.

The binaries come from FPA_SERVE_BIN / FPA_GENERATE_BIN (set by ctest) or build/server/.
Most tests use the small random-weight model of tests/vectors/fpa_free (fast on 2 cores).
"""
from __future__ import annotations

import json
import subprocess

import pytest

from daemon import (GENERATE_BIN, LONG, REPO, TEST_MODEL, Server, fpa_client,  # noqa: F401
                    wait_for)


@pytest.fixture(scope="session")
def server():
    """One shared server: max batch 32, prompts up to 2048 tokens, generations up to LONG tokens
    (seconds: long enough to cancel one midway)."""
    s = Server("--max-prompt-tokens", "2048", "--max-new-tokens", str(LONG))
    yield s
    s.stop()


@pytest.fixture
def make_server():
    """Starts extra servers with their own flags; stops them after the test."""
    started = []

    def make(*flags, **kw):
        s = Server(*flags, **kw)
        started.append(s)
        return s

    yield make
    for s in started:
        s.stop()


def solo_generate(prompt: str | list[int], model: str = TEST_MODEL, **flags) -> list[int]:
    """Tokens from fpa-generate: ModelRunner::generate without the server or batching."""
    cmd = [GENERATE_BIN, "--model", model]
    if isinstance(prompt, str):
        cmd += ["--prompt", prompt]
    else:
        cmd += ["--tokens", ",".join(map(str, prompt))]
    for k, v in flags.items():
        cmd += ["--" + k.replace("_", "-"), str(v)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=120)
    return json.loads(out.stdout)["tokens"]
