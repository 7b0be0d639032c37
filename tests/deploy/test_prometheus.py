"""Prometheus files checked by Prometheus's own promtool: config, rules, and unit tests of
the alerts (tests/deploy/alerts_test.yml)."""

import shutil
import subprocess

import pytest

from deploy_env import DEPLOY, HERE, flag_values, load_yaml_docs, metrics_port

PROMTOOL = shutil.which("promtool")
pytestmark = pytest.mark.skipif(PROMTOOL is None, reason="promtool (Debian's prometheus) absent")


def promtool(*args):
    result = subprocess.run([PROMTOOL, *map(str, args)], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_config_is_valid():
    out = promtool("check", "config", DEPLOY / "prometheus/prometheus.yml")
    assert "1 rule files found" in out


def test_rules_are_valid():
    out = promtool("check", "rules", DEPLOY / "prometheus/rules/fpa-serve.rules.yml")
    assert "SUCCESS" in out


def test_alerts_fire_when_they_should():
    promtool("test", "rules", HERE / "alerts_test.yml")


def test_scrape_target_is_the_compose_service_metrics_port():
    config = load_yaml_docs(DEPLOY / "prometheus/prometheus.yml")[0]
    (job,) = [j for j in config["scrape_configs"] if j["job_name"] == "fpa-serve"]
    assert job.get("metrics_path", "/metrics") == "/metrics"
    targets = [t for sc in job["static_configs"] for t in sc["targets"]]
    compose = load_yaml_docs(DEPLOY / "compose.yaml")[0]
    serve = compose["services"]["fpa-serve"]
    port = int(flag_values(serve["command"])["--metrics-address"].rsplit(":", 1)[1])
    assert port == metrics_port()
    assert targets == [f"fpa-serve:{port}"]
