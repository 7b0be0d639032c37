"""Fixtures that run the real fpa-serve on loopback ports and always stop it.

The binaries come from FPA_SERVE_BIN / FPA_GENERATE_BIN (set by ctest) or build/server/.
Most tests use the small random-weight model of tests/vectors/fpa_free (fast on 2 cores).
"""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import traceback

import pytest

from daemon import (GENERATE_BIN, LONG, REPO, TEST_MODEL, Server, fpa_client,  # noqa: F401
                    wait_for)


# A test's bound, far above the slowest (about a minute under a sanitizer): a test that hangs fails
# with where it waited and what its servers logged, instead of ctest's timeout killing the suite
# with nothing printed. Where the wait holds the interpreter and the alarm cannot break in, pytest
# prints every thread's stack a little later (faulthandler_timeout, pytest.ini).
TEST_SECONDS = 240


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Each phase's report on the test item, for the fixtures that print on a failure."""
    report = (yield).get_result()
    setattr(item, "report_" + report.when, report)


def _failed(node) -> bool:
    reports = (getattr(node, "report_" + when, None) for when in ("setup", "call"))
    return any(r is not None and r.failed for r in reports)


@pytest.fixture(autouse=True)
def bounded(request):
    capture = request.config.pluginmanager.getplugin("capturemanager")

    def expire(signum, frame):
        # Said at once, past pytest's capture: a suite that ctest kills later loses the report
        # pytest prints at its end.
        with capture.global_and_fixture_disabled():
            print(f"\n{request.node.nodeid}: ran past {TEST_SECONDS} s, waiting at:",
                  file=sys.stderr)
            traceback.print_stack(frame, limit=12, file=sys.stderr)
        raise TimeoutError(f"the test ran past {TEST_SECONDS} s")
    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(TEST_SECONDS)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


@pytest.fixture(scope="session")
def server():
    """One shared server: max batch 32, prompts up to 2048 tokens, generations up to LONG tokens
    (seconds: long enough to cancel one midway)."""
    s = Server("--max-prompt-tokens", "2048", "--max-new-tokens", str(LONG))
    yield s
    s.stop()


@pytest.fixture
def make_server(request):
    """Starts extra servers with their own flags; stops them after the test, showing what each
    logged when the test failed."""
    started = []

    def make(*flags, **kw):
        s = Server(*flags, **kw)
        started.append(s)
        return s

    yield make
    for s in started:
        if _failed(request.node):
            print(f"--- the end of the log of fpa-serve on port {s.port} ---\n{s.output()[-4000:]}")
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
