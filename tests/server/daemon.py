"""A real fpa-serve on loopback ports (any free ones), with a client; always stopped.

Shared by the server tests and the benchmark harness test. The binaries come from
FPA_SERVE_BIN / FPA_GENERATE_BIN (set by ctest) or build/server/.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.request

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "client"))
import fpa_client  # noqa: E402

SERVE_BIN = os.environ.get("FPA_SERVE_BIN", os.path.join(REPO, "build", "server", "fpa-serve"))
GENERATE_BIN = os.environ.get("FPA_GENERATE_BIN",
                              os.path.join(REPO, "build", "server", "fpa-generate"))
TEST_MODEL = os.path.join(REPO, "tests", "vectors", "fpa_free")
STARTUP_SECONDS = 60
LONG = 100000  # max_new_tokens of a request that runs for seconds


def _launcher(nofile: int | None) -> list[str]:
    """The command before the server's: it dies with pytest (a killed run leaves no server
    behind: PR_SET_PDEATHSIG), and nofile is its open-file limit (soft and hard). Done by
    util-linux's setpriv and prlimit as they exec it, not by a preexec_fn: that runs Python in
    the forked child of a process with gRPC's threads, which can hang before the exec (a lock
    held by another thread at the fork), and Popen with it, with no timeout."""
    cmd = ["setpriv", "--pdeathsig", "KILL"]
    if nofile is not None:
        cmd += ["prlimit", f"--nofile={nofile}:{nofile}"]
    return cmd


def wait_for(predicate, timeout=10.0):
    """Polls `predicate` until it holds; fails the test after `timeout` seconds."""
    deadline = time.time() + timeout
    while not predicate():
        assert time.time() < deadline, "timed out"
        time.sleep(0.02)


class Server:
    """A running fpa-serve with a client, its address and its /metrics URL."""

    def __init__(self, *flags: str, model: str = TEST_MODEL, nofile: int | None = None):
        """nofile: the open-file limit (soft and hard) of the server process."""
        if not os.path.exists(SERVE_BIN):
            pytest.fail(f"{SERVE_BIN} is not built")
        self.log = tempfile.NamedTemporaryFile(prefix="fpa-serve-", suffix=".log", delete=False)
        # A pool of 16384 pages unless the caller sizes it in bytes.
        pool = [] if "--cache-bytes" in flags else ["--cache-pages", "16384"]
        cmd = [*_launcher(nofile), SERVE_BIN, "--model", model, "--address", "127.0.0.1:0",
               "--metrics-address", "127.0.0.1:0", "--http-address", "127.0.0.1:0",
               "--threads", "1", *pool, *flags]
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        self.port, self.metrics_port = self._wait_for_ports()
        self.address = f"127.0.0.1:{self.port}"
        self.metrics_url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        self.client = fpa_client.FpaClient(self.address, timeout=120)
        self._wait_serving()

    def output(self) -> str:
        with open(self.log.name, errors="replace") as f:
            return f.read()

    def http_port(self) -> int:
        """The OpenAI API's port (--http-address 127.0.0.1:0), from the startup line."""
        return int(re.search(r"(\d+) \(http\)", self.output()).group(1))

    def _wait_for_ports(self):
        deadline = time.time() + STARTUP_SECONDS
        while time.time() < deadline:
            m = re.search(r"listening on [\d.]+:(\d+) \(gRPC\), [\d.]+:(\d+) \(metrics\)",
                          self.output())
            if m:
                return int(m.group(1)), int(m.group(2))
            if self.proc.poll() is not None:
                pytest.fail(f"fpa-serve exited with {self.proc.returncode}:\n{self.output()}")
            time.sleep(0.05)
        self.stop()
        pytest.fail(f"fpa-serve did not start:\n{self.output()}")

    def _wait_serving(self):
        deadline = time.time() + STARTUP_SECONDS
        while self.client.health() != "SERVING":
            assert time.time() < deadline, "health never reported SERVING"
            time.sleep(0.05)

    def metrics(self) -> dict[str, float]:
        """Samples of /metrics: 'name{labels}' -> value."""
        with urllib.request.urlopen(self.metrics_url, timeout=10) as r:
            text = r.read().decode()
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                out[name] = float(value)
        return out

    def stop(self):
        # A sanitized daemon that found something stops itself once its report is written (the
        # symbolizer takes a while): let it finish, and show the report in the test's output.
        if "Sanitizer" in self.output():
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                pass
            print(self.output()[-20000:])
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        os.unlink(self.log.name)
