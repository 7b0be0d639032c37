#!/usr/bin/python3
"""Renders the Grafana dashboard's panels with real data, without Grafana (which does not run
here): starts fpa-serve on loopback, has Debian's Prometheus scrape it every second, drives a
bounded load through three phases (light, overload, light), then runs every panel's PromQL
from deploy/grafana/dashboards/fpa-serve.json through Prometheus's query_range API and draws
the panels in the dashboard's own grid with matplotlib.

  /usr/bin/python3 deploy/render_dashboard.py [--build build] [--model DIR] [--out bench/dashboard.png]
"""

import argparse
import json
import random
import shutil
import sys
import threading
import time
import urllib.parse
from pathlib import Path

import grpc
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import yaml  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests/deploy"))
from deploy_env import (DEPLOY, GRAFANA_MACROS, Process, dashboard, free_port,  # noqa: E402
                        scrape, serve_argv, shipped_model, wait_until)

# (seconds, concurrent clients): light, then more than --max-batch, then light again.
PHASES = [(30, 2), (40, 10), (30, 1)]
RATE_INTERVAL = "10s"


def client_loop(stub, fpa_pb2, stop, rng):
    while not stop.is_set():
        prompt = "".join(rng.choice("abcdefghij ") for _ in range(rng.randint(16, 600)))
        request = fpa_pb2.GenerateRequest(text=prompt, max_new_tokens=rng.randint(16, 160),
                                          temperature=0.8, seed=rng.randint(0, 1 << 30))
        try:
            stub.Generate(request, timeout=120)
        except grpc.RpcError:
            stop.wait(0.5)  # RESOURCE_EXHAUSTED under overload: back off like a real client


def drive_load(address, build):
    sys.path.insert(0, str(build / "proto/python"))
    from fpa.v1 import fpa_pb2, fpa_pb2_grpc
    with grpc.insecure_channel(address) as channel:
        stub = fpa_pb2_grpc.FpaServiceStub(channel)
        workers = []
        for seconds, clients in PHASES:
            while len(workers) < clients:
                stop = threading.Event()
                thread = threading.Thread(target=client_loop, daemon=True,
                                          args=(stub, fpa_pb2, stop, random.Random(len(workers))))
                thread.start()
                workers.append((thread, stop))
            while len(workers) > clients:
                thread, stop = workers.pop()
                stop.set()
            print(f"load: {clients} clients for {seconds} s", flush=True)
            time.sleep(seconds)
        for thread, stop in workers:
            stop.set()
        for thread, _ in workers:
            thread.join(timeout=130)


def query_range(api, expr, start, end):
    params = urllib.parse.urlencode({"query": expr, "start": start, "end": end, "step": "1"})
    answer = json.loads(scrape(f"{api}/query_range?{params}", timeout=30))
    assert answer["status"] == "success", answer
    return answer["data"]["result"]


def promql(expr):
    for macro, value in {**GRAFANA_MACROS, "$__rate_interval": RATE_INTERVAL}.items():
        expr = expr.replace(macro, value)
    return expr


def legend(target, metric):
    text = target.get("legendFormat") or ""
    for key, value in metric.items():
        text = text.replace("{{" + key + "}}", value)
    return text or json.dumps(metric)


UNIT_SCALE = {"bytes": (1 / 2**20, "MiB"), "percentunit": (100, "%"), "s": (1000, "ms"),
              "reqps": (1, "req/s"), "short": (1, "")}


def right_axis_series(panel):
    """Series names that the panel's overrides put on a right-hand axis."""
    return {o["matcher"]["options"] for o in panel["fieldConfig"].get("overrides", [])
            if o["matcher"]["id"] == "byName"
            and {"id": "custom.axisPlacement", "value": "right"} in o["properties"]}


def draw_timeseries(ax, panel, api, start, end):
    scale, unit = UNIT_SCALE[panel["fieldConfig"]["defaults"].get("unit", "short")]
    right, twin = right_axis_series(panel), None
    colors = iter(plt.rcParams["axes.prop_cycle"].by_key()["color"])
    for target in panel["targets"]:
        for series in query_range(api, promql(target["expr"]), start, end):
            t = np.array([float(v[0]) for v in series["values"]]) - start
            y = np.array([float(v[1]) for v in series["values"]]) * scale
            name = legend(target, series["metric"])
            if name in right:
                twin = twin or ax.twinx()
                twin.plot(t, y, lw=1.5, color=next(colors), label=name)
                twin.set_ylabel(name, fontsize=7)
                twin.tick_params(labelsize=7)
            else:
                ax.plot(t, y, lw=1.5, color=next(colors), label=name)
    ax.set_ylabel(unit)
    ax.set_xlim(0, end - start)
    handles = [h for a in (ax, twin) if a for h in a.get_legend_handles_labels()[0]]
    ax.legend(handles=handles, fontsize=7, loc="upper left")


def draw_stat(ax, panel, api, start, end):
    (target,) = panel["targets"]
    series = query_range(api, promql(target["expr"]), start, end)
    values = [float(v[1]) for s in series for v in s["values"] if v[1] != "NaN"]
    ax.axis("off")
    last = values[-1] if values else float("nan")
    ax.text(0.5, 0.55, f"{last * 100:.1f}%", ha="center", va="center", fontsize=26,
            color="tab:green", transform=ax.transAxes)
    ax.text(0.5, 0.2, "last value while sequences were live", ha="center", fontsize=7,
            transform=ax.transAxes)


def draw_heatmap(ax, panel, api, start, end):
    (target,) = panel["targets"]
    series = query_range(api, promql(target["expr"]), start, end)
    series = sorted(series, key=lambda s: float(s["metric"]["le"]))
    times = sorted({float(v[0]) for s in series for v in s["values"]})
    index = {t: i for i, t in enumerate(times)}
    cumulative = np.zeros((len(series), len(times)))
    for row, s in enumerate(series):
        for t, v in s["values"]:
            cumulative[row, index[float(t)]] = float(v)
    counts = np.diff(np.vstack([np.zeros(len(times)), cumulative]), axis=0).clip(min=0)
    edges = [float(s["metric"]["le"]) for s in series]
    labels = [f"≤{e:g}" if e != float("inf") else "+Inf" for e in edges]
    ax.imshow(counts, aspect="auto", origin="lower", cmap="Oranges", interpolation="nearest",
              extent=(times[0] - start, times[-1] - start, -0.5, len(edges) - 0.5))
    ax.set_yticks(range(len(edges)), labels, fontsize=6)
    ax.set_ylabel("live fraction bucket")


def summarize(api, start, end):
    """Whole-run figures for bench/RESULTS.md, from the same Prometheus."""
    window = f"{int(end - start)}s"
    figures = {
        "requests by status": f"sum by (code) (increase(fpa_requests_total[{window}]))",
        "mean live-key fraction of finished requests":
            f"sum(increase(fpa_request_live_fraction_sum[{window}])) / "
            f"sum(increase(fpa_request_live_fraction_count[{window}]))",
        "mean bytes held / bytes of a full cache (while any were live)":
            f"avg_over_time((sum(fpa_cache_bytes_held) / sum(fpa_cache_bytes_full) > 0)"
            f"[{window}:1s])",
        "peak pages in use / pool": f"max_over_time((sum(fpa_cache_pages_in_use) / "
                                    f"sum(fpa_cache_pages))[{window}:1s])",
    }
    for name, expr in figures.items():
        url = f"{api}/query?" + urllib.parse.urlencode({"query": expr, "time": end})
        result = json.loads(scrape(url))["data"]["result"]
        values = ", ".join(" ".join([*r["metric"].values(), f"{float(r['value'][1]):.3g}"])
                           for r in result)
        print(f"{name}: {values}")


DRAW = {"timeseries": draw_timeseries, "stat": draw_stat, "heatmap": draw_heatmap}


def render(api, start, end, out):
    board = dashboard()
    rows = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in board["panels"])
    fig = plt.figure(figsize=(20, rows * 0.5))
    grid = fig.add_gridspec(rows, 24, hspace=3.2, wspace=2.5, top=0.95, bottom=0.03)
    for panel in board["panels"]:
        g = panel["gridPos"]
        ax = fig.add_subplot(grid[g["y"]:g["y"] + g["h"], g["x"]:g["x"] + g["w"]])
        if panel["type"] == "row":
            ax.axis("off")
            ax.text(0, 0, panel["title"], fontsize=13, weight="bold", transform=ax.transAxes)
            continue
        DRAW[panel["type"]](ax, panel, api, start, end)
        ax.set_title(panel["title"], fontsize=10, loc="left")
        if panel["type"] != "stat":
            ax.set_xlabel("seconds", fontsize=7)
            ax.tick_params(labelsize=7)
    phases = ", ".join(f"{clients} clients for {seconds} s" for seconds, clients in PHASES)
    fig.suptitle(f"{board['title']}: each panel's PromQL through Prometheus scraping a live "
                 f"fpa-serve ({phases})", fontsize=12)
    fig.savefig(out, dpi=80, bbox_inches="tight")
    print(f"wrote {out}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--build", type=Path, default=REPO / "build")
    parser.add_argument("--model", type=Path, default=shipped_model())
    parser.add_argument("--out", type=Path, default=REPO / "bench/dashboard.png")
    parser.add_argument("--workdir", type=Path, default=REPO / "bench/out/dashboard")
    args = parser.parse_args()
    shutil.rmtree(args.workdir, ignore_errors=True)  # a fresh Prometheus database each run
    args.workdir.mkdir(parents=True)
    grpc_port, metrics_port, prom_port = free_port(), free_port(), free_port()
    serve = serve_argv(args.build / "server/fpa-serve", args.model, grpc_port, metrics_port,
                       "--threads", "1", "--max-batch", "4", "--max-queue", "6",
                       "--cache-pages", "512", "--page-slots", "16")
    config = yaml.safe_load((DEPLOY / "prometheus/prometheus.yml").read_text())
    config["global"] = {"scrape_interval": "1s", "evaluation_interval": "5s"}
    config["rule_files"] = [str(DEPLOY / "prometheus" / f) for f in config["rule_files"]]
    config["scrape_configs"][0]["static_configs"] = [{"targets": [f"127.0.0.1:{metrics_port}"]}]
    (args.workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
    prometheus = ["prometheus", f"--config.file={args.workdir / 'prometheus.yml'}",
                  f"--storage.tsdb.path={args.workdir / 'data'}",
                  f"--web.listen-address=127.0.0.1:{prom_port}"]
    api = f"http://127.0.0.1:{prom_port}/api/v1"
    with Process(serve, args.workdir / "serve.log") as server, \
            Process(prometheus, args.workdir / "prometheus.log") as prom:
        wait_until(lambda: scrape(f"http://127.0.0.1:{metrics_port}/metrics"), "fpa-serve", server)
        wait_until(lambda: scrape(f"http://127.0.0.1:{prom_port}/-/ready"), "Prometheus", prom)
        start = time.time()
        drive_load(f"127.0.0.1:{grpc_port}", args.build)
        time.sleep(5)
        end = time.time()
        render(api, start, end, args.out)
        summarize(api, start, end)


if __name__ == "__main__":
    main()
