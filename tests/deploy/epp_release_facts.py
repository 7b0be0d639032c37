"""Facts about one release of the Gateway API Inference Extension's endpoint picker (EPP), read
from its source at the release tag, for test_inference_gateway.py: the flags it defines and the
ones it refuses, the plugin types it knows, its config API, the CRDs it ships and the kinds it
watches. The result is committed (tests/deploy/data/epp-<tag>.json), so the test needs no network.

    git clone https://github.com/kubernetes-sigs/gateway-api-inference-extension gie
    git -C gie checkout v1.5.0
    /usr/bin/python3 tests/deploy/epp_release_facts.py gie v1.5.0 > tests/deploy/data/epp-v1.5.0.json
"""
import json
import pathlib
import re
import subprocess
import sys

import yaml

FLAG_SOURCES = ["pkg/epp/server/options.go", "pkg/common/observability/logging/options.go"]
# controller-runtime's zap.Options.BindFlags, which logging/options.go binds (a dependency, not in
# the repository; these five names are stable across controller-runtime releases).
ZAP_FLAGS = ["zap-devel", "zap-encoder", "zap-log-level", "zap-stacktrace-level",
             "zap-time-encoding"]


def go_files(root, folder):
    return [p for p in (root / folder).rglob("*.go") if not p.name.endswith("_test.go")]


def flags(root):
    names = set(ZAP_FLAGS)
    for f in FLAG_SOURCES:
        names |= set(re.findall(r'fs\.\w+Var(?:P)?\(&[\w.]+,\s*"([\w-]+)"', (root / f).read_text()))
    return sorted(names)


def deprecated_flags(root):
    text = (root / FLAG_SOURCES[0]).read_text()
    block = re.search(r"deprecatedMetricFlags := \[\]string\{(.*?)\}", text, re.S)
    return sorted(re.findall(r'"([\w-]+)"', block.group(1))) if block else []


def plugin_types(root):
    types = set()
    for p in go_files(root, "pkg/epp"):
        types |= set(re.findall(r'\b\w*Type\s*=\s*"([a-z0-9][a-z0-9-]*)"', p.read_text()))
    return sorted(types)


def default_vllm_metrics(root):
    text = (root / "pkg/epp/framework/plugins/datalayer/extractor/metrics/factories.go").read_text()
    block = re.search(r'Name:\s*"vllm",(.*?)\}', text, re.S).group(1)
    return dict(re.findall(r'(\w+Spec):\s*"([^"]*)"', block))


def config_api(root):
    text = (root / "pkg/epp/config/loader/defaults.go").read_text()
    return {"apiVersion": re.search(r'APIVersion:\s*"([^"]+)"', text).group(1),
            "kind": re.search(r'Kind:\s*"([^"]+)"', text).group(1)}


def crds(root):
    out = []
    for p in sorted((root / "config/crd/bases").glob("*.yaml")):
        spec = yaml.safe_load(p.read_text())["spec"]
        out.append({"file": p.name, "group": spec["group"], "kind": spec["names"]["kind"],
                    "plural": spec["names"]["plural"],
                    "versions": [v["name"] for v in spec["versions"] if v.get("served")]})
    return out


def watched_kinds(root):
    kinds = set()
    for p in go_files(root, "pkg/epp/controller"):
        kinds |= set(re.findall(r"For\(&\w+\.(\w+)\{\}\)", p.read_text()))
    return sorted(kinds)


def main():
    root, tag = pathlib.Path(sys.argv[1]), sys.argv[2]
    commit = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True,
                            text=True).stdout.strip() or None
    facts = {"release": tag, "commit": commit,
             "image": f"registry.k8s.io/gateway-api-inference-extension/epp:{tag}",
             "flags": flags(root), "deprecated_flags": deprecated_flags(root),
             "plugin_types": plugin_types(root), "config_api": config_api(root),
             "default_vllm_metrics": default_vllm_metrics(root), "crds": crds(root),
             "watched_kinds": watched_kinds(root)}
    json.dump(facts, sys.stdout, indent=1, sort_keys=True)
    print()


if __name__ == "__main__":
    main()
