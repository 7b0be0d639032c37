"""deploy/k8s/inference-gateway: the InferencePool example against the Gateway API Inference
Extension's published v1 types, against the fpa-serve pods it selects, the endpoint picker's
flags, config and CRDs against the picker release it pins, and the metric names that picker reads
against a live fpa-serve's HTTP port.

The v1 pool facts below are those of the extension's api/v1/inferencepool_types.go and its
generated CRD: the fields that exist, which are required, and their ranges. The picker's facts
are read from its source at the pinned tag by epp_release_facts.py (data/epp-<tag>.json)."""
import json

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from deploy_env import DEPLOY, HERE, flag_values, kustomize, load_yaml_docs, node, serving_flags
from live_http import served_metrics

GATEWAY = DEPLOY / "k8s/inference-gateway"
POOL_API = "inference.networking.k8s.io/v1"
SPEC_FIELDS = {"selector", "targetPorts", "endpointPickerRef"}  # all required
PICKER_REF_FIELDS = {"group", "kind", "name", "port", "failureMode"}  # name; port for a Service
FAILURE_MODES = {"FailOpen", "FailClose"}
# The picker release the example pins, and what its source says (epp_release_facts.py).
PICKER = json.loads((HERE / "data/epp-v1.5.0.json").read_text())
# The metrics extractor's specs that name model-server gauges (the extension's model server
# protocol: queued requests, running requests, KV cache utilisation).
GAUGE_SPECS = ["queuedRequestsSpec", "runningRequestsSpec", "kvUsageSpec"]


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
            {"ServiceAccount", "Role", "RoleBinding", "Service", "Deployment", "ConfigMap"}]
    assert len(core) == 6
    result = node("k8s_types.mjs", input_json=core)
    assert result.returncode == 0, result.stdout + result.stderr


def test_kustomize_renders_the_example():
    assert "InferencePool" in {o["kind"] for o in kustomize(GATEWAY)}


def picker_container():
    picker = one("Deployment", one("InferencePool")["spec"]["endpointPickerRef"]["name"])
    (container,) = picker["spec"]["template"]["spec"]["containers"]
    return picker, container


def picker_config():
    """The EndpointPickerConfig that --config-file names, through its volume and ConfigMap."""
    picker, container = picker_container()
    path = flag_values(container["args"])["--config-file"]
    (mount,) = [m for m in container["volumeMounts"] if path.startswith(m["mountPath"] + "/")]
    (volume,) = [v for v in picker["spec"]["template"]["spec"]["volumes"]
                 if v["name"] == mount["name"]]
    config_map = one("ConfigMap", volume["configMap"]["name"])
    return yaml.safe_load(config_map["data"][path[len(mount["mountPath"]) + 1:]])


def test_the_picker_image_is_the_pinned_release():
    assert picker_container()[1]["image"] == PICKER["image"]


def test_every_picker_flag_exists_in_its_release_and_is_not_refused():
    args = flag_values(picker_container()[1]["args"])
    for flag in args:
        assert flag[2:] in PICKER["flags"], f"{flag} is not a flag of the picker {PICKER['release']}"
        assert flag[2:] not in PICKER["deprecated_flags"], f"{PICKER['release']} refuses {flag}"
    assert ("--pool-name" in args) != ("--endpoint-selector" in args)  # its Validate()


def test_the_picker_config_uses_what_its_release_knows():
    config = picker_config()
    assert {k: config[k] for k in ("apiVersion", "kind")} == PICKER["config_api"]
    names = {p.get("name", p["type"]): p["type"] for p in config["plugins"]}
    assert set(names.values()) <= set(PICKER["plugin_types"])
    refs = [p["pluginRef"] for prof in config["schedulingProfiles"] for p in prof["plugins"]]
    for source in config["dataLayer"]["sources"]:
        refs += [source["pluginRef"]] + [e["pluginRef"] for e in source["extractors"]]
    assert set(refs) <= set(names), "a pluginRef names no plugin"


def test_the_crds_the_picker_watches_are_in_the_kustomization():
    rendered = {(o["spec"]["group"], o["spec"]["names"]["kind"]): o for o in kustomize(GATEWAY)
                if o["kind"] == "CustomResourceDefinition"}
    crds = {c["kind"]: c for c in PICKER["crds"]}
    for kind in set(PICKER["watched_kinds"]) - {"Pod"}:
        crd = rendered[(crds[kind]["group"], kind)]
        assert [v["name"] for v in crd["spec"]["versions"] if v["served"]] == crds[kind]["versions"]


def test_the_role_lets_the_picker_watch_them():
    rules = one("Role", picker_container()[0]["spec"]["template"]["spec"]["serviceAccountName"])
    granted = {(g, r) for rule in rules["rules"] if {"get", "list", "watch"} <= set(rule["verbs"])
               for g in rule["apiGroups"] for r in rule["resources"]}
    crds = {c["kind"]: c for c in PICKER["crds"]}
    for kind in PICKER["watched_kinds"]:
        need = ("", "pods") if kind == "Pod" else (crds[kind]["group"], crds[kind]["plural"])
        assert need in granted, kind


def test_the_metrics_the_picker_reads_are_gauges_of_a_live_fpa_serve(tmp_path):
    config = picker_config()
    (source,) = [p for p in config["plugins"] if p["type"] == "metrics-data-source"]
    (extractor,) = [p for p in config["plugins"] if p["type"] == "core-metrics-extractor"]
    params = extractor["parameters"]
    (engine,) = [e for e in params["engineConfigs"] if e["name"] == params["defaultEngine"]]
    assert source["parameters"]["path"] == "/metrics"
    with served_metrics(tmp_path) as text:
        families = {f.name: f for f in text_string_to_metric_families(text)}
    for spec in GAUGE_SPECS:
        name = engine[spec]
        assert name in families, (spec, name)
        assert families[name].type == "gauge", (spec, name)
        (sample,) = families[name].samples
        assert 0 <= sample.value <= (1 if spec == "kvUsageSpec" else 1e9)
    if engine.get("cacheInfoSpec"):  # an info gauge whose labels give the block layout
        (info,) = families[engine["cacheInfoSpec"]].samples
        assert int(info.labels["block_size"]) > 0 and int(info.labels["num_gpu_blocks"]) > 0
