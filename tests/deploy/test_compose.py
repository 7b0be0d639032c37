"""deploy/compose.yaml (and its GPU override), validated by Debian's docker-compose (the
Compose file schema; no engine needed for `config`) and checked against the serving contract
and the Dockerfile."""

import re
import shutil
import subprocess

import pytest
import yaml

from deploy_env import (DEPLOY, REPO, dockerfile_facts, drain_seconds, flag_values, grpc_port,
                        healthcheck_command, http_port, load_yaml_docs, metrics_port,
                        serving_flags, stage)

COMPOSE = shutil.which("docker-compose")


def compose_config(*files):
    """The merged, validated configuration `docker-compose config` prints."""
    if COMPOSE is None:
        pytest.skip("docker-compose (Debian's, for schema validation) absent")
    argv = [COMPOSE]
    for f in files:
        argv += ["-f", str(DEPLOY / f)]
    result = subprocess.run([*argv, "config"], capture_output=True, text=True, timeout=120,
                            cwd=DEPLOY)
    assert result.returncode == 0, result.stderr
    return yaml.safe_load(result.stdout)


def seconds(duration):
    match = re.fullmatch(r"(?:(\d+)m)?(?:(\d+)s)?", duration)
    assert match and duration, f"unexpected duration {duration!r}"
    return int(match.group(1) or 0) * 60 + int(match.group(2) or 0)


def test_fpa_serve_follows_the_serving_contract():
    serve = compose_config("compose.yaml")["services"]["fpa-serve"]
    flags = flag_values(serve["command"])
    assert set(flags) <= set(serving_flags()), set(flags) - set(serving_flags())
    grpc = int(flags["--address"].rsplit(":", 1)[1])
    metrics = int(flags["--metrics-address"].rsplit(":", 1)[1])
    http = int(flags["--http-address"].rsplit(":", 1)[1])
    assert (grpc, metrics, http) == (grpc_port(), metrics_port(), http_port())
    published = {(int(p["published"]), int(p["target"])) for p in serve["ports"]}
    assert published == {(grpc, grpc), (metrics, metrics), (http, http)}
    drain = int(flags.get("--drain-seconds", drain_seconds()))
    assert seconds(serve["stop_grace_period"]) > drain


def test_fpa_serve_builds_a_dockerfile_stage_and_checks_health_like_the_image():
    facts = dockerfile_facts()
    stages = {s["name"] for s in facts["stages"]}
    serve = compose_config("compose.yaml")["services"]["fpa-serve"]
    assert (REPO / serve["build"]["dockerfile"]).exists()
    assert serve["build"]["context"] == str(REPO)
    assert serve["build"]["target"] in stages
    gpu = compose_config("compose.yaml", "compose.gpu.yaml")["services"]["fpa-serve"]
    assert gpu["build"]["target"] in stages
    assert serve["healthcheck"]["test"] == ["CMD", *healthcheck_command(stage(facts, "runtime"))]


def test_gpu_override_reserves_a_gpu_and_selects_cuda():
    serve = compose_config("compose.yaml", "compose.gpu.yaml")["services"]["fpa-serve"]
    assert flag_values(serve["command"])["--backend"] == "cuda"
    (device,) = serve["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and "gpu" in device["capabilities"]
    assert stage(dockerfile_facts(), serve["build"]["target"])["from"] == "runtime"


def test_prometheus_gets_its_config_and_rules_where_the_config_looks():
    prom = compose_config("compose.yaml")["services"]["prometheus"]
    mounts = {m.split(":")[1]: m.split(":")[0] for m in prom["volumes"]}
    config_flag = next(a for a in prom["command"] if a.startswith("--config.file="))
    config_path = config_flag.split("=", 1)[1]
    assert mounts[config_path] == str(DEPLOY / "prometheus/prometheus.yml")
    config = load_yaml_docs(DEPLOY / "prometheus/prometheus.yml")[0]
    config_dir = config_path.rsplit("/", 1)[0]
    for rule_file in config["rule_files"]:
        in_container = f"{config_dir}/{rule_file}"
        mount = max((m for m in mounts if in_container.startswith(m + "/")), key=len)
        host = mounts[mount] + in_container[len(mount):]
        assert (DEPLOY / host).exists(), host
