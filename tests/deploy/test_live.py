"""Against a running fpa-serve under a small real load, scraped by a real Prometheus (Debian's):
every metric the dashboard, the alert rules and the autoscaler name is one the server really
exports; every dashboard query returns data; every alert rule evaluates without error."""

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from deploy_env import (BUILD, DEPLOY, Process, adapter_queries, contract_metrics,
                        dashboard_queries, fpa_serve_binary, free_port, load_yaml_docs,
                        model_for_tests, promql_metric_names, rule_queries, scrape, serve_argv,
                        serving_flags, wait_until)

sys.path.insert(0, str(BUILD / "proto/python"))


def stubs():
    try:
        from fpa.v1 import fpa_pb2, fpa_pb2_grpc
        from grpc_health.v1 import health_pb2, health_pb2_grpc
    except ImportError as e:
        pytest.skip(f"Python stubs not generated in {BUILD}/proto/python yet: {e}")
    return fpa_pb2, fpa_pb2_grpc, health_pb2, health_pb2_grpc


PROMPTS = ["The first passage of a walk", "abc " * 40, "Hello", "0123456789" * 12,
           "A cache that forgets", "x"]


def send_load(address, fpa_pb2, fpa_pb2_grpc):
    """A bounded load: a few generations at once, and one request the server must reject."""
    with grpc.insecure_channel(address) as channel:
        stub = fpa_pb2_grpc.FpaServiceStub(channel)

        def generate(prompt):
            request = fpa_pb2.GenerateRequest(text=prompt, max_new_tokens=24, temperature=0.0)
            return stub.Generate(request, timeout=120)

        with ThreadPoolExecutor(max_workers=4) as pool:
            for response in pool.map(generate, PROMPTS):
                assert response.usage.generated_tokens > 0
        with pytest.raises(grpc.RpcError) as rejected:
            stub.Generate(fpa_pb2.GenerateRequest(text="x", max_new_tokens=-1), timeout=30)
        assert rejected.value.code() == grpc.StatusCode.INVALID_ARGUMENT


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    """fpa-serve, scraped every second by Prometheus, after a small load: its metrics text,
    the Prometheus API URL and the Prometheus process."""
    binary, model = fpa_serve_binary(), model_for_tests()
    if binary is None:
        pytest.skip(f"fpa-serve not built in {BUILD} yet")
    if model is None:
        pytest.skip("no model yet (models/fpa-v2 or tests/vectors/fpa_free)")
    fpa_pb2, fpa_pb2_grpc, health_pb2, health_pb2_grpc = stubs()
    tmp = tmp_path_factory.mktemp("live")
    grpc_port, metrics_port, prom_port = free_port(), free_port(), free_port()
    argv = serve_argv(binary, model, grpc_port, metrics_port, "--threads", "1",
                      "--cache-pages", "1024", "--page-slots", "16", "--drain-seconds", "5")
    config = load_yaml_docs(DEPLOY / "prometheus/prometheus.yml")[0]
    config["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s"}
    config["rule_files"] = [str(DEPLOY / "prometheus" / f) for f in config["rule_files"]]
    config["scrape_configs"][0]["static_configs"] = [{"targets": [f"127.0.0.1:{metrics_port}"]}]
    (tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
    prom_argv = ["prometheus", f"--config.file={tmp / 'prometheus.yml'}",
                 f"--storage.tsdb.path={tmp / 'data'}",
                 f"--web.listen-address=127.0.0.1:{prom_port}"]
    api = f"http://127.0.0.1:{prom_port}/api/v1"

    with Process(argv, tmp / "serve.log") as server, \
            Process(prom_argv, tmp / "prometheus.log") as prometheus:
        def serving():
            with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
                try:
                    check = health_pb2_grpc.HealthStub(channel).Check(
                        health_pb2.HealthCheckRequest(service="fpa.v1.FpaService"), timeout=2)
                except grpc.RpcError:
                    return False  # not listening yet
                return check.status == health_pb2.HealthCheckResponse.SERVING
        wait_until(serving, "fpa-serve health SERVING", server, timeout=60)
        wait_until(lambda: scrape(f"http://127.0.0.1:{prom_port}/-/ready"), "Prometheus ready",
                   prometheus)
        send_load(f"127.0.0.1:{grpc_port}", fpa_pb2, fpa_pb2_grpc)

        def scraped_after_load():
            # rate() needs a few samples after the series appeared, however fast the load was.
            done = query(api, "sum(fpa_requests_total) and on() "
                              "min(count_over_time(fpa_requests_total[15s])) >= 3")
            return done and float(done[0]["value"][1]) >= len(PROMPTS) + 1
        wait_until(scraped_after_load, "Prometheus scraped the load", prometheus, timeout=30)
        yield {"metrics": scrape(f"http://127.0.0.1:{metrics_port}/metrics"), "api": api,
               "prometheus": prometheus}


def query(api, expr):
    url = f"{api}/query?" + urllib.parse.urlencode({"query": expr})
    answer = json.loads(scrape(url))
    assert answer["status"] == "success", f"{expr}: {answer}"
    return answer["data"]["result"]


def exported(metrics_text):
    return {s.name for family in text_string_to_metric_families(metrics_text)
            for s in family.samples}


def test_every_contract_metric_is_exported(live):
    names = exported(live["metrics"])
    for name, kind in contract_metrics().items():
        sample = f"{name}_bucket" if kind == "histogram" else name
        assert sample in names, f"docs/serving.md promises {name} ({kind})"


@pytest.mark.parametrize("source", [dashboard_queries, rule_queries, adapter_queries])
def test_queries_name_only_exported_metrics(live, source):
    names = exported(live["metrics"])
    queries = source()
    for (where, expr), (used, errors) in zip(queries, promql_metric_names([q for _, q in queries])):
        assert not errors, f"{where}: {errors}"
        assert used <= names, f"{where}: {sorted(used - names)} not exported by fpa-serve"


def test_autoscaler_metric_is_exported(live):
    (hpa,) = load_yaml_docs(DEPLOY / "k8s/cpu/hpa.yaml")
    (metric,) = hpa["spec"]["metrics"]
    assert metric["pods"]["metric"]["name"] in exported(live["metrics"])


def test_dashboard_queries_return_data_from_prometheus(live):
    for where, expr in dashboard_queries():
        assert query(live["api"], expr), f"{where}: no data for {expr}"


def test_alert_rules_evaluate_without_errors_in_prometheus(live):
    def evaluated():
        groups = json.loads(scrape(f"{live['api']}/rules"))["data"]["groups"]
        rules = [r for g in groups for r in g["rules"]]
        done = rules and all(not r["lastEvaluation"].startswith("0001") for r in rules)
        return rules if done else None
    rules = wait_until(evaluated, "Prometheus evaluated the rules", live["prometheus"])
    assert {r["name"] for r in rules} == {name for name, _ in rule_queries()}
    for rule in rules:
        assert rule["health"] == "ok", f"{rule['name']}: {rule.get('lastError')}"
    # Under this light load nothing is wrong, so nothing fires.
    assert [r["name"] for r in rules if r["state"] == "firing"] == []


def test_sigterm_turns_readiness_off_and_finishes_in_flight_requests(tmp_path):
    """What the pods' readiness probe and terminationGracePeriodSeconds rely on."""
    binary, model = fpa_serve_binary(), model_for_tests()
    if binary is None or model is None:
        pytest.skip("fpa-serve or a model not there yet")
    fpa_pb2, fpa_pb2_grpc, health_pb2, health_pb2_grpc = stubs()
    grpc_port, metrics_port = free_port(), free_port()
    argv = serve_argv(binary, model, grpc_port, metrics_port, "--threads", "1",
                      "--drain-seconds", "60")
    with Process(argv, tmp_path / "serve.log") as server, \
            grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
        health = health_pb2_grpc.HealthStub(channel)

        def status():
            try:
                return health.Check(health_pb2.HealthCheckRequest(service="fpa.v1.FpaService"),
                                    timeout=2).status
            except grpc.RpcError:
                return None
        wait_until(lambda: status() == health_pb2.HealthCheckResponse.SERVING, "SERVING", server)
        # Enough in flight (several long generations) that the drain outlasts the checks.
        request = fpa_pb2.GenerateRequest(text="drain", max_new_tokens=2000, ignore_eos=True)
        streams = [fpa_pb2_grpc.FpaServiceStub(channel).GenerateStream(request, timeout=120)
                   for _ in range(4)]
        counts = [len(next(stream).token_ids) for stream in streams]
        os.kill(server.proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 5
        while status() == health_pb2.HealthCheckResponse.SERVING and time.monotonic() < deadline:
            time.sleep(0.02)
        assert status() == health_pb2.HealthCheckResponse.NOT_SERVING
        for i, stream in enumerate(streams):
            counts[i] += sum(len(message.token_ids) for message in stream)
        assert counts == [2000] * 4, "in-flight requests were cut short"
        assert server.proc.wait(timeout=65) == 0


def test_the_binary_takes_every_flag_of_the_contract():
    """The deploy files are checked against docs/serving.md; this checks that against the
    daemon's own --help."""
    binary = fpa_serve_binary()
    if binary is None:
        pytest.skip(f"fpa-serve not built in {BUILD} yet")
    result = subprocess.run([str(binary), "--help"], capture_output=True, text=True, timeout=30)
    taken = set(re.findall(r"^\s+(--[a-z-]+)", result.stdout + result.stderr, re.M))
    assert set(serving_flags()) <= taken, set(serving_flags()) - taken
