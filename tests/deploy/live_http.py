"""A live fpa-serve whose OpenAI-compatible HTTP port has served a few completions, scraped
over HTTP: what the vLLM-compatibility checks read."""
import contextlib
import json
import urllib.request

import pytest

from deploy_env import Process, fpa_serve_binary, free_port, model_for_tests, scrape, serve_argv
from deploy_env import wait_until

SERVED_NAME = "fpa-test"


def complete(port, **body):
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/completions", data=json.dumps(body).encode(),
        headers={"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.load(response)


@contextlib.contextmanager
def served_metrics(tmp_path):
    """The text of /metrics on the HTTP port after three completions."""
    binary, model = fpa_serve_binary(), model_for_tests()
    if binary is None or model is None:
        pytest.skip("fpa-serve or a model not there yet")
    http = free_port()
    argv = serve_argv(binary, model, free_port(), free_port(), "--threads", "1",
                      "--http-address", f"127.0.0.1:{http}", "--served-model-name", SERVED_NAME)
    with Process(argv, tmp_path / "serve.log") as server:
        wait_until(lambda: scrape(f"http://127.0.0.1:{http}/health") == "", "health", server)
        for seed in range(3):
            complete(http, prompt="The sky is blue. " * 8, max_tokens=6, seed=seed, ignore_eos=True)
        yield scrape(f"http://127.0.0.1:{http}/metrics")
