"""The Grafana dashboard and its provisioning: Grafana's types, layout, datasource references,
the panels the issue asks for, and PromQL that Prometheus's grammar accepts."""

import itertools
import json
from urllib.parse import urlparse

from deploy_env import (DEPLOY, dashboard, dashboard_queries, load_yaml_docs, node,
                        promql_metric_names)

DASHBOARD_JSON = DEPLOY / "grafana/dashboards/fpa-serve.json"


def provisioned_datasources():
    return load_yaml_docs(DEPLOY / "grafana/provisioning/datasources/prometheus.yaml")[0][
        "datasources"]


def all_panels():
    for panel in dashboard()["panels"]:
        yield panel
        yield from panel.get("panels", [])


def test_dashboard_type_checks_against_grafana_schema():
    result = node("dashboard_types.mjs", DASHBOARD_JSON)
    assert result.returncode == 0, result.stdout + result.stderr


def test_type_check_rejects_a_misspelt_option(tmp_path):
    board = dashboard()
    stat = next(p for p in board["panels"] if p["type"] == "stat")
    stat["options"]["colourMode"] = stat["options"].pop("colorMode")
    board["panels"] = [stat]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(board))
    result = node("dashboard_types.mjs", bad)
    assert result.returncode == 1 and "colourMode" in result.stderr


def test_panel_ids_are_unique_and_panels_do_not_overlap():
    panels = list(all_panels())
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), ids
    boxes = []
    for p in panels:
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24 and g["h"] > 0, p["title"]
        boxes.append((p["title"], g["x"], g["y"], g["x"] + g["w"], g["y"] + g["h"]))
    for a, b in itertools.combinations(boxes, 2):
        overlap = a[1] < b[3] and b[1] < a[3] and a[2] < b[4] and b[2] < a[4]
        assert not overlap, f"panels {a[0]!r} and {b[0]!r} overlap"


def test_datasource_references_resolve_to_the_provisioned_prometheus():
    (source,) = provisioned_datasources()
    refs = []
    for p in all_panels():
        if p["type"] != "row":
            refs.append((p["title"], p["datasource"]))
            refs += [(p["title"], t["datasource"]) for t in p["targets"]]
    refs += [(v["name"], v["datasource"]) for v in dashboard()["templating"]["list"]]
    for where, ref in refs:
        assert ref == {"type": source["type"], "uid": source["uid"]}, where


def test_provisioned_datasource_is_the_compose_prometheus():
    (source,) = provisioned_datasources()
    compose = load_yaml_docs(DEPLOY / "compose.yaml")[0]["services"]
    url = urlparse(source["url"])
    assert url.hostname in compose
    assert f"{url.port}:{url.port}" in compose[url.hostname]["ports"]
    assert source["type"] == "prometheus" and source["isDefault"]


def test_dashboard_provider_reads_the_mounted_dashboards():
    (provider,) = load_yaml_docs(DEPLOY / "grafana/provisioning/dashboards/fpa-serve.yaml")[0][
        "providers"]
    grafana = load_yaml_docs(DEPLOY / "compose.yaml")[0]["services"]["grafana"]
    mounts = dict(v.rsplit(":", 1)[0].split(":", 1) for v in grafana["volumes"])
    assert mounts["./grafana/dashboards"] == provider["options"]["path"]
    home = grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home == f"{provider['options']['path']}/{DASHBOARD_JSON.name}"
    for host_path, container_path in mounts.items():
        assert (DEPLOY / host_path).is_dir(), host_path
        if container_path.startswith("/etc/grafana/provisioning/"):
            assert host_path == "./grafana/provisioning/" + container_path.rsplit("/", 1)[1]


def test_queries_parse_as_promql():
    queries = dashboard_queries()
    for (where, expr), (_, errors) in zip(queries, promql_metric_names([q for _, q in queries])):
        assert not errors, f"{where}: {expr}: {errors}"


def test_dashboard_shows_what_the_issue_asks_for():
    used = {}
    for (title, _), (names, _) in zip(dashboard_queries(),
                                       promql_metric_names([q for _, q in dashboard_queries()])):
        for name in names:
            used.setdefault(name, set()).add(title)
    wanted = [
        {"fpa_cache_bytes_held", "fpa_cache_bytes_full"},  # bytes held vs a full cache
        {"fpa_cache_pages_in_use", "fpa_cache_pages"},  # pages in use vs total
        {"fpa_request_live_fraction_bucket"},  # live-key fraction distribution
        {"fpa_cache_keys_evicted_total"},  # keys evicted per second
        {"fpa_requests_running", "fpa_requests_waiting"},
        {"fpa_time_to_first_token_seconds_bucket"},
        {"fpa_inter_token_latency_seconds_bucket"},
        {"fpa_generated_tokens_total"},  # tokens per second
    ]
    for names in wanted:
        panels = set.intersection(*(used.get(n, set()) for n in names))
        assert panels, f"no panel shows {sorted(names)} together"
    heatmaps = [p for p in all_panels() if p["type"] == "heatmap"]
    assert any("fpa_request_live_fraction_bucket" in t["expr"] and t.get("format") == "heatmap"
               for p in heatmaps for t in p["targets"])
