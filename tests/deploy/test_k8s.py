"""Kubernetes manifests (deploy/k8s): Kubernetes' API types, kustomize rendering of both
variants, and ports, probes, flags and drain timing against the serving contract."""

import functools

import pytest
import yaml

from deploy_env import (DEPLOY, dockerfile_facts, drain_seconds, flag_values, grpc_port,
                        instructions, kustomize, load_yaml_docs, metrics_port, node,
                        serving_flags, stage)

K8S = DEPLOY / "k8s"
HEALTH_SERVICES = {"", "fpa.v1.FpaService"}  # docs/serving.md


def files_of(variant_dir):
    kustomization = load_yaml_docs(variant_dir / "kustomization.yaml")[0]
    return [doc for f in kustomization["resources"] for doc in load_yaml_docs(variant_dir / f)]


def rendered(variant):
    return kustomize(K8S / variant)


@functools.cache
def variants():
    """(name, objects): the CPU files as written, and both variants as kustomize renders them."""
    return (("cpu files", files_of(K8S / "cpu")), ("cpu", rendered("cpu")),
            ("gpu", rendered("gpu")))


def one(objects, kind, name):
    (found,) = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    return found


def serve_container(objects):
    (container,) = one(objects, "Deployment", "fpa-serve")["spec"]["template"]["spec"][
        "containers"]
    return container


def type_check(objects):
    return node("k8s_types.mjs", input_json=objects)


def test_objects_type_check_against_kubernetes_api():
    # One compiler run for all variants: most of its time is loading the API types.
    result = type_check([o for _, objects in variants() for o in objects])
    assert result.returncode == 0, result.stdout + result.stderr


def test_type_check_rejects_a_misspelt_probe():
    deployment = one(files_of(K8S / "cpu"), "Deployment", "fpa-serve")
    container = serve_container([deployment])
    container["readinessprobe"] = container.pop("readinessProbe")
    result = type_check([deployment])
    assert result.returncode == 1 and "readinessprobe" in result.stderr


def test_kustomize_renders_every_file_of_the_cpu_variant():
    def names(objects):
        return sorted((o["kind"], o["metadata"]["name"]) for o in objects)
    assert names(rendered("cpu")) == names(files_of(K8S / "cpu"))


@pytest.mark.parametrize("name,objects", variants())
def test_ports_flags_and_scrape_annotations_agree(name, objects):
    pod = one(objects, "Deployment", "fpa-serve")["spec"]["template"]
    container = serve_container(objects)
    flags = flag_values(container["args"])
    assert set(flags) <= set(serving_flags()), set(flags) - set(serving_flags())
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["grpc"] == int(flags["--address"].rsplit(":", 1)[1]) == grpc_port()
    assert ports["metrics"] == int(flags["--metrics-address"].rsplit(":", 1)[1]) == metrics_port()
    notes = pod["metadata"]["annotations"]
    assert notes["prometheus.io/scrape"] == "true"
    assert int(notes["prometheus.io/port"]) == ports["metrics"]
    assert notes["prometheus.io/path"] == "/metrics"
    assert flags["--backend"] == ("cuda" if name == "gpu" else "cpu")


@pytest.mark.parametrize("name,objects", variants())
def test_probes_use_grpc_health_on_the_grpc_port(name, objects):
    container = serve_container(objects)
    grpc = next(p["containerPort"] for p in container["ports"] if p["name"] == "grpc")
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        action = container[probe]["grpc"]
        assert action["port"] == grpc, probe
        assert action.get("service", "") in HEALTH_SERVICES, probe
    # Readiness follows the FPA service, which the server turns NOT_SERVING while draining.
    assert container["readinessProbe"]["grpc"]["service"] == "fpa.v1.FpaService"


@pytest.mark.parametrize("name,objects", variants())
def test_termination_outlasts_the_drain(name, objects):
    pod = one(objects, "Deployment", "fpa-serve")["spec"]["template"]["spec"]
    container = serve_container(objects)
    drain = int(flag_values(container["args"]).get("--drain-seconds", drain_seconds()))
    command = container["lifecycle"]["preStop"]["exec"]["command"]
    assert command[0] == "sleep"
    assert pod["terminationGracePeriodSeconds"] > drain + int(command[1])


@pytest.mark.parametrize("name,objects", variants())
def test_pods_run_as_the_image_user_and_image_matches_variant(name, objects):
    pod = one(objects, "Deployment", "fpa-serve")["spec"]["template"]["spec"]
    facts = dockerfile_facts()
    (user,) = instructions(stage(facts, "runtime"), "USER")
    uid = int(user["args"][0].split(":")[0])
    assert pod["securityContext"]["runAsNonRoot"] and pod["securityContext"]["runAsUser"] == uid
    container = serve_container(objects)
    target = container["image"].rsplit(":", 1)[1]
    assert target in {s["name"] for s in facts["stages"]}
    gpus = container["resources"]["limits"].get("nvidia.com/gpu")
    assert (target, gpus) == (("cuda", "1") if name == "gpu" else ("cpu", None))


@pytest.mark.parametrize("name,objects", variants())
def test_services_select_the_pods_and_reach_named_ports(name, objects):
    labels = one(objects, "Deployment", "fpa-serve")["spec"]["template"]["metadata"]["labels"]
    ports = {p["name"]: p["containerPort"] for p in serve_container(objects)["ports"]}
    for service in ("fpa-serve", "fpa-serve-headless"):
        spec = one(objects, "Service", service)["spec"]
        assert spec["selector"].items() <= labels.items()
        for port in spec["ports"]:
            assert port["port"] == ports[port["targetPort"]], (service, port)
    assert one(objects, "Service", "fpa-serve-headless")["spec"]["clusterIP"] == "None"
    pdb = one(objects, "PodDisruptionBudget", "fpa-serve")["spec"]
    assert pdb["selector"]["matchLabels"].items() <= labels.items()


def envoy_config(objects):
    return yaml.safe_load(one(objects, "ConfigMap", "fpa-serve-envoy")["data"]["envoy.yaml"])


@pytest.mark.parametrize("name,objects", variants())
def test_envoy_balances_over_the_headless_service_by_grpc_health(name, objects):
    config = envoy_config(objects)["static_resources"]
    (cluster,) = config["clusters"]
    (listener,) = config["listeners"]
    (endpoint,) = [e["endpoint"]["address"]["socket_address"]
                   for group in cluster["load_assignment"]["endpoints"]
                   for e in group["lb_endpoints"]]
    headless = one(objects, "Service", "fpa-serve-headless")
    assert endpoint["address"] == headless["metadata"]["name"]
    assert endpoint["port_value"] == grpc_port()
    assert cluster["type"] == "STRICT_DNS"  # every pod address, not one virtual IP
    options = cluster["typed_extension_protocol_options"][
        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]
    assert "http2_protocol_options" in options["explicit_http_config"]
    (check,) = cluster["health_checks"]
    readiness = serve_container(objects)["readinessProbe"]["grpc"]["service"]
    assert check["grpc_health_check"]["service_name"] == readiness
    (envoy,) = one(objects, "Deployment", "fpa-serve-envoy")["spec"]["template"]["spec"][
        "containers"]
    envoy_ports = {p["name"]: p["containerPort"] for p in envoy["ports"]}
    assert envoy_ports["grpc"] == listener["address"]["socket_address"]["port_value"]
    lb = one(objects, "Service", "fpa-serve-lb")["spec"]
    assert [envoy_ports[p["targetPort"]] for p in lb["ports"]] == [envoy_ports["grpc"]]


@pytest.mark.parametrize("name,objects", variants())
def test_autoscaler_scales_the_deployment_on_an_adapter_metric(name, objects):
    hpa = one(objects, "HorizontalPodAutoscaler", "fpa-serve")["spec"]
    assert hpa["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment",
                                     "name": "fpa-serve"}
    assert 1 < hpa["minReplicas"] < hpa["maxReplicas"]
    adapter = load_yaml_docs(K8S / "prometheus-adapter-values.yaml")[0]
    served = {rule["name"]["as"] for rule in adapter["rules"]["custom"]}
    (metric,) = hpa["metrics"]
    assert metric["type"] == "Pods" and metric["pods"]["metric"]["name"] in served
