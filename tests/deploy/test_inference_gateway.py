"""deploy/k8s/inference-gateway: the InferencePool example against the Gateway API Inference
Extension's published v1 types, against the fpa-serve pods it selects, and the metric names its
endpoint picker reads against a live fpa-serve's HTTP port.

The v1 facts below are those of the extension's release v1.0, from
https://github.com/kubernetes-sigs/gateway-api-inference-extension/blob/main/api/v1/inferencepool_types.go
and its generated CRD: the fields that exist, which are required, and their ranges."""
import pytest
from prometheus_client.parser import text_string_to_metric_families

from deploy_env import DEPLOY, flag_values, kustomize, load_yaml_docs, node, serving_flags
from live_http import served_metrics

GATEWAY = DEPLOY / "k8s/inference-gateway"
POOL_API = "inference.networking.k8s.io/v1"
SPEC_FIELDS = {"selector", "targetPorts", "endpointPickerRef"}  # all required
PICKER_REF_FIELDS = {"group", "kind", "name", "port", "failureMode"}  # name; port for a Service
FAILURE_MODES = {"FailOpen", "FailClose"}
# The endpoint picker's flags that name model-server metrics (the extension's model server
# protocol: queued requests, running requests, KV cache utilisation; all gauges).
METRIC_FLAGS = ["--total-queued-requests-metric", "--total-running-requests-metric",
                "--kv-cache-usage-percentage-metric"]


def objects():
    kustomization = load_yaml_docs(GATEWAY / "kustomization.yaml")[0]
    return [doc for f in kustomization["resources"] for doc in load_yaml_docs(GATEWAY / f)]


def one(kind, name=None, docs=None):
    (found,) = [o for o in (docs or objects())
                if o["kind"] == kind and name in (None, o["metadata"]["name"])]
    return found


def port_in_range(n):
    return isinstance(n, int) and 1 <= n <= 65535


def test_the_pool_has_the_v1_shape():
    pool = one("InferencePool")
    assert pool["apiVersion"] == POOL_API
    spec = pool["spec"]
    assert set(spec) == SPEC_FIELDS
    assert set(spec["selector"]) == {"matchLabels"} and spec["selector"]["matchLabels"]
    (port,) = spec["targetPorts"]  # the v1 API allows exactly one
    assert set(port) == {"number"} and port_in_range(port["number"])
    ref = spec["endpointPickerRef"]
    assert set(ref) <= PICKER_REF_FIELDS and ref["name"]
    assert set(ref["port"]) == {"number"} and port_in_range(ref["port"]["number"])
    assert ref.get("failureMode", "FailClose") in FAILURE_MODES


def test_the_pool_selects_the_fpa_serve_pods_on_their_http_port():
    pool = one("InferencePool")["spec"]
    pods = one("Deployment", "fpa-serve", load_yaml_docs(DEPLOY / "k8s/cpu/deployment.yaml"))
    template = pods["spec"]["template"]
    assert pool["selector"]["matchLabels"].items() <= template["metadata"]["labels"].items()
    (container,) = template["spec"]["containers"]
    http = next(p["containerPort"] for p in container["ports"] if p["name"] == "http")
    flag = flag_values(container["args"])["--http-address"]
    assert pool["targetPorts"][0]["number"] == http == int(flag.rsplit(":", 1)[1])
    assert http == int(serving_flags()["--http-address"].rsplit(":", 1)[1])


def test_the_picker_ref_reaches_the_endpoint_picker():
    pool = one("InferencePool")
    ref = pool["spec"]["endpointPickerRef"]
    service = one("Service", ref["name"])
    (port,) = [p for p in service["spec"]["ports"] if p["port"] == ref["port"]["number"]]
    picker = one("Deployment", ref["name"])
    (container,) = picker["spec"]["template"]["spec"]["containers"]
    named = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert named[port["targetPort"]] == int(flag_values(container["args"])["--grpc-port"])
    assert flag_values(container["args"])["--pool-name"] == pool["metadata"]["name"]
    assert service["spec"]["selector"].items() <= picker["spec"]["template"]["metadata"][
        "labels"].items()
    route = one("HTTPRoute")
    (backend,) = route["spec"]["rules"][0]["backendRefs"]
    assert (backend["group"], backend["kind"], backend["name"]) == (
        "inference.networking.k8s.io", "InferencePool", pool["metadata"]["name"])


def test_the_core_objects_type_check_against_kubernetes_api():
    core = [o for o in objects() if o["kind"] in
            {"ServiceAccount", "Role", "RoleBinding", "Service", "Deployment"}]
    assert len(core) == 5
    result = node("k8s_types.mjs", input_json=core)
    assert result.returncode == 0, result.stdout + result.stderr


def test_kustomize_renders_the_example():
    assert "InferencePool" in {o["kind"] for o in kustomize(GATEWAY)}


def test_the_metrics_the_picker_reads_are_gauges_of_a_live_fpa_serve(tmp_path):
    picker = one("Deployment", one("InferencePool")["spec"]["endpointPickerRef"]["name"])
    args = flag_values(picker["spec"]["template"]["spec"]["containers"][0]["args"])
    assert args["--model-server-metrics-path"] == "/metrics"
    with served_metrics(tmp_path) as text:
        families = {f.name: f for f in text_string_to_metric_families(text)}
    for flag in METRIC_FLAGS:
        name = args[flag]
        assert name in families, (flag, name)
        assert families[name].type == "gauge", (flag, name)
        (sample,) = families[name].samples
        assert 0 <= sample.value <= (1 if "usage" in flag else 1e9)
