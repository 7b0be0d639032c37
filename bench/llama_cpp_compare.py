"""fpa-serve's CPU backend and llama.cpp on the same models, in one interleaved run (issues 12, 26).

    /usr/bin/python3 bench/llama_cpp_compare.py [--bench build/bench/fpa-decode-bench]
        [--shapes tiny 25m 85m] [--steps 64] [--windows 8] [--threads 2] [--rounds 2]
        [--ours-weights f32|bf16|int8|auto] [--ours-kv f32|bf16|auto] [--max-stolen 0.05]
        [--stolen-retries 2] [--smoke]

(about 9 minutes with --rounds 2 on the 2-core machine at load average 1-2; 5 with one round)

What it does, all under bench/out/llama_cpp/ (git-ignored):
  1. llama.cpp: `npm install @node-llama-cpp/linux-x64@3.22.1` (prebuilt libllama and libggml,
     one CPU backend per microarchitecture; the driver loads the one ggml scores highest on this
     CPU) and `npm pack node-llama-cpp@3.22.1`, whose llama/gitRelease.bundle is llama.cpp's
     source at the same release: its include/ and ggml/include/ are taken from it, and
     bench/llama_cpp_driver.cc is compiled against them with g++.
  2. Models: the tiny shape is the shipped models/softmax-tiny and models/fpa-tiny (d_model 160,
     3 layers, 2x64 heads, d_ff 512); the 25M (512, 8 layers, 8x64, 1376) and 85M (768, 12,
     12x64, 2048) shapes, and with --shapes 1b (2048, 16, 32x64, 5632), get random weights
     (train/reference.py's init_weights, seed 0, the FPA walk's bias -0.1 as in
     bench/decode_compare.py), softmax with RoPE theta 10000 and FPA with free levels. Each
     softmax model is written as GGUF (bench/gguf_write.py) in f32, bf16 and Q8_0 (llama.cpp's
     int8 blocks of 32 with an f16 scale, from the same float weights our int8 quantizes per row).
  3. A logits check: llama.cpp's logits for a 200-token sequence of softmax-tiny against
     train/reference.py's forward (max abs difference printed, f32, bf16 and Q8_0).
  4. Per shape and case (decode at batch 1 with context 512 and 4096, batch 8 and 32 at 512;
     prefill 512 and 4096 from the batch-1 runs), one process per engine configuration, in an
     order that rotates from case to case: fpa-serve softmax (full cache), fpa-serve FPA
     (eviction on at the model's tau), llama.cpp f32 weights + f32 cache (flash attention off),
     llama.cpp bf16 weights + f16 cache with flash attention, llama.cpp Q8_0 weights + f16
     cache with flash attention. Every side runs the same token streams
     (bench/decode_tokens.h), the same number of timed steps, fastest window.
  5. The machine's limits, measured on it at the start (build/bench/fpa-machine-limits): read
     bandwidth over buffers of 4 MiB to 1 GiB (from the last-level cache to DRAM), oneDNN's
     f32 / bf16 / int8 product rates, the CPU's model, cache sizes and features. DRAM's read
     bandwidth again just before and just after every side's run (a shared machine's drifted
     from 56 to 81 GB/s within an hour here): a side whose bytes exceed the last-level cache is
     held to the start's curve scaled to the mean of the two. The product rates again at the
     end, each format's faster probe the limit: the first probe of a session read 0.3-0.4 of
     the rate on an Intel Xeon (int8 1205 GFLOP/s, then 3331-4090), which inflated every
     fraction the products bound.
  6. The share of the machine's CPU its host gave to other guests during each side's run
     (/proc/stat's steal), printed beside the figures: a side whose run lost more than
     --max-stolen (5%) is run again, up to --stolen-retries (2) times.
Prints the limits, then a markdown table: tokens/s of each side, ratios to llama.cpp (its f32
configuration, its Q8_0 and its fastest), and each side's fraction of the limit that applies
(decode: the least time a step can take, bytes of weights + keys and values read per step over
the read bandwidth measured at that many bytes, so weights in the cache are held to the cache's
rate and larger ones to DRAM's; at a batch where the weights' products take longer than reading
them, the products at the product rate of the side's weight format instead; prefill: FLOPs over
the product rate of the side's weight format). FPA has no llama.cpp
equivalent: its rows compare with llama.cpp's full-cache softmax. --smoke: the tiny shape, a few
steps, one case per kind: checks that everything runs, its figures mean nothing.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "train"))
import gguf_write  # noqa: E402
from decode_compare import find_bench  # noqa: E402

NPM_VERSION = "3.22.1"
SHAPES = {  # d_model, n_layers, n_heads, d_ff (head_dim 64)
    "tiny": (160, 3, 2, 512),
    "25m": (512, 8, 8, 1376),
    "85m": (768, 12, 12, 2048),
    # Weights past a large last-level cache (issue 26 asks for shapes whose weights exceed it):
    # 0.8G parameters, 0.85 GB as int8. Not in the default sweep: 3.3 GB of float32 per model.
    "1b": (2048, 16, 32, 5632),
}
CASES = [(1, 512), (8, 512), (32, 512), (1, 4096)]  # (batch, context)
# llama.cpp's fastest configuration per weight dtype on this machine (probed on the 25M shape,
# bench/RESULTS.md): f32 decodes fastest without flash attention (with it, 5x slower at 4096);
# bf16 weights with an f16 cache fastest with it (1.15-1.55x decode, 1.3-2.7x prefill).
# Q8_0 fastest with flash attention and an f16 cache too (probed on the 1b shape, all four
# flash x cache options, bench/RESULTS.md of 2026-12-05, seventh session): first or tied at
# batch 1 and 8 and at 4096, first at prefill; flash with an f32 cache runs 4-9x slower.
LLAMA = {  # name: (gguf dtype, driver flags)
    "llama f32": ("f32", ["--flash", "off", "--cache", "f32"]),
    "llama bf16": ("bf16", ["--flash", "on", "--cache", "f16"]),
    "llama q8_0": ("q8_0", ["--flash", "on", "--cache", "f16"]),
}
# Bytes a weight takes: Q8_0 is 34 bytes per 32 values; our int8 one byte plus a float32 scale
# per row (under 1% at these widths, left out).
WEIGHT_BYTES = {"f32": 4, "bf16": 2, "int8": 1, "q8_0": 34 / 32}
# The product rate a side's prefill is held to (machine_limits' formats).
RATE = {"f32": "f32", "bf16": "bf16", "int8": "int8", "q8_0": "int8"}


def sh(cmd, **kw) -> str:
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw).stdout


def setup_llama(out: str) -> tuple[str, str]:
    """npm packages -> (library dir, driver binary)."""
    npm = os.path.join(out, "npm")
    lib = os.path.join(npm, "node_modules", "@node-llama-cpp", "linux-x64", "bins", "linux-x64")
    if not os.path.isdir(lib):
        os.makedirs(npm, exist_ok=True)
        sh(["npm", "install", "--ignore-scripts", "--no-save", "--no-package-lock",
            f"@node-llama-cpp/linux-x64@{NPM_VERSION}"], cwd=npm)
    src = os.path.join(npm, "llama-headers")
    if not os.path.isdir(src):
        sh(["npm", "pack", f"node-llama-cpp@{NPM_VERSION}"], cwd=npm)
        tgz = os.path.join(npm, f"node-llama-cpp-{NPM_VERSION}.tgz")
        sh(["tar", "xzf", tgz, "-C", npm, "package/llama/gitRelease.bundle"])
        bare = os.path.join(npm, "llama.git")
        sh(["git", "clone", "-q", "--bare", os.path.join(npm, "package/llama/gitRelease.bundle"),
            bare])
        os.makedirs(src)
        archive = subprocess.run(["git", "--git-dir", bare, "archive", "HEAD", "include",
                                  "ggml/include"], check=True, capture_output=True).stdout
        subprocess.run(["tar", "x", "-C", src], input=archive, check=True)
    driver = os.path.join(out, "llama-driver")
    # Compiled again only when its source is newer (a minute on a busy 2-core machine).
    sources = [os.path.join(HERE, f) for f in ("llama_cpp_driver.cc", "decode_tokens.h")]
    if os.path.exists(driver) and os.path.getmtime(driver) > max(map(os.path.getmtime, sources)):
        return lib, driver
    sh(["g++", "-std=c++20", "-O2", "-Wall", "-Werror", f"-I{ROOT}",
        f"-I{src}/include", f"-I{src}/ggml/include", os.path.join(HERE, "llama_cpp_driver.cc"),
        "-o", driver, f"-L{lib}", "-l:libllama.v0.5.0.so", "-l:libggml.v0.5.0.so",
        "-l:libggml-base.so", f"-Wl,-rpath,{os.path.abspath(lib)}", "-ldl"])
    return lib, driver


def weight_count(shape: str) -> int:
    """Parameters a decode step reads: every layer's projections and the (tied) lm_head."""
    d, layers, heads, ff = SHAPES[shape]
    return layers * (4 * heads * 64 * d + 3 * ff * d) + 259 * d


def save_random(path: str, cfg) -> str:
    """A random-weight model of train/reference.py's Config `cfg` at path, once: init_weights,
    seed 0, the FPA walk's bias -0.1 (as bench/decode_compare.py)."""
    import torch
    from export import save_model
    from reference import Model
    torch.set_num_threads(1)
    if not os.path.exists(os.path.join(path, "model.safetensors")):
        model = Model(cfg).init_weights(0, field_bias=-0.1)
        save_model(model, path, {"note": "random weights for bench/ comparisons, seed 0, "
                                         "field_bias -0.1"})
    return path


def write_random(out: str, shape: str, kind: str) -> str:
    """A random-weight model of `shape` (softmax with RoPE, or fpa) under out/models/, once."""
    from reference import Config
    d, layers, heads, ff = SHAPES[shape]
    cfg = Config(d_model=d, n_layers=layers, n_heads=heads, head_dim=64, d_ff=ff,
                 attention=kind, levels="free" if kind == "fpa" else "tied",
                 rope_theta=10000.0 if kind == "softmax" else 0.0)
    return save_random(os.path.join(out, "models", f"{shape}-{kind}"), cfg)


def write_ggufs(model_dir: str, stem: str, dtypes) -> dict:
    """{dtype: stem-dtype.gguf}: the softmax model in model_dir as GGUF in each dtype, once."""
    out = {}
    for dtype in dtypes:
        out[dtype] = f"{stem}-{dtype}.gguf"
        if not os.path.exists(out[dtype]):
            gguf_write.convert(model_dir, out[dtype], dtype)
    return out


def write_models(out: str, shapes: list[str]) -> dict:
    """{shape: {"softmax": dir, "fpa": dir, "f32": gguf, "bf16": gguf}}"""
    models = {}
    os.makedirs(os.path.join(out, "models"), exist_ok=True)
    for shape in shapes:
        m = {kind: os.path.join(ROOT, "models", f"{kind}-tiny") if shape == "tiny"
             else write_random(out, shape, kind) for kind in ("softmax", "fpa")}
        m.update(write_ggufs(m["softmax"], os.path.join(out, "models", f"{shape}-softmax"),
                             [dtype for dtype, _ in LLAMA.values()]))
        models[shape] = m
    return models


def check_logits(lib: str, driver: str, out: str) -> list[str]:
    """llama.cpp vs train/reference.py on softmax-tiny, 200 tokens, every position."""
    import numpy as np
    import torch
    from export import load_model
    from reference import encode
    model_dir = os.path.join(ROOT, "models", "softmax-tiny")
    text = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    tokens = encode(text)[:200]
    with torch.no_grad():
        ref = load_model(model_dir)(torch.tensor([tokens]))[0].numpy()
    lines = []
    for dtype, flags in LLAMA.values():
        gguf = os.path.join(out, "models", f"tiny-softmax-{dtype}.gguf")
        got = os.path.join(out, f"logits-{dtype}.f32")
        sh([driver, "--lib", lib, "--model", gguf, *flags, "logits",
            ",".join(map(str, tokens)), got])
        llama = np.fromfile(got, dtype=np.float32).reshape(len(tokens), -1)
        lines.append(f"softmax-tiny, {len(tokens)} tokens, llama.cpp {dtype} weights "
                     f"({' '.join(flags)}) vs train/reference.py (float32): max |diff| "
                     f"{np.abs(llama - ref).max():.3g} (logits up to {np.abs(ref).max():.3g})")
    return lines


def run_ours(bench: str, model_dir: str, batch: int, context: int, evict: bool, a) -> dict:
    out = sh([bench, f"--model={model_dir}", f"--batch={batch}", f"--context={context}",
              f"--evict={'on' if evict else 'off'}", f"--steps={a.steps}",
              f"--windows={a.windows}", f"--threads={a.threads}", "--prefill_chunk=512",
              f"--cpu_weights={a.ours_weights}", f"--kv_dtype={a.ours_kv}"])
    return json.loads(out.splitlines()[-1])


def run_llama(lib: str, driver: str, gguf: str, flags: list, batch: int, context: int, a) -> dict:
    out = sh([driver, "--lib", lib, "--model", gguf, *flags, "bench", "--batch", str(batch),
              "--context", str(context), "--steps", str(a.steps), "--windows", str(a.windows),
              "--threads", str(a.threads), "--prefill-chunk", "512"])
    return json.loads(out.splitlines()[-1])


def machine_limits(bench: str, threads: int, *flags: str) -> dict:
    """build/bench/fpa-machine-limits (beside the decode bench): the CPU, read GB/s by buffer
    MiB, oneDNN's product GFLOP/s."""
    tool = os.path.join(os.path.dirname(bench), "fpa-machine-limits")
    return json.loads(sh([tool, f"--threads={threads}", *flags]).splitlines()[-1])


def dram_gbps(bench: str, threads: int) -> float:
    """DRAM's read bandwidth now: a 1 GiB buffer on both page sizes, about 4 s."""
    lim = machine_limits(bench, threads, "--products=false", "--read_mib=1024", "--seconds=0.3")
    return lim["read_gbps"]["1024"]


def cpu_ticks() -> tuple[int, int] | None:
    """(stolen, all) CPU ticks of the machine since boot, from /proc/stat's first line (user
    nice system idle iowait irq softirq steal); None where it has no steal column."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
        ticks = [int(x) for x in fields[1:9]]
    except (OSError, ValueError):
        return None
    return (ticks[7], sum(ticks)) if fields[:1] == ["cpu"] and len(ticks) == 8 else None


def stolen_since(start: tuple[int, int] | None) -> float | None:
    """The share of the machine's CPU time its host gave to other guests since cpu_ticks()
    returned `start` (None where unknown)."""
    now = cpu_ticks() if start is not None else None
    if now is None or now[1] <= start[1]:
        return None
    return (now[0] - start[0]) / (now[1] - start[1])


def beside_machine(run, a) -> dict:
    """run()'s result with the DRAM bandwidth measured just before and just after it, and the
    share of the CPU the host took meanwhile (run_cpu_stolen: a shared machine lost 20-50% of
    it during a batch-32 decode and read DRAM at 12.7 GB/s where it reads 30 when not
    contended); run again, up to a.stolen_retries more times, while that share is over
    a.max_stolen."""
    for retries_left in range(a.stolen_retries, -1, -1):
        start = cpu_ticks()
        before = dram_gbps(a.bench, a.threads)
        r = run()
        r["dram_gbps"] = [before, dram_gbps(a.bench, a.threads)]
        r["run_cpu_stolen"] = stolen_since(start)
        if r["run_cpu_stolen"] is None or r["run_cpu_stolen"] <= a.max_stolen or not retries_left:
            return r
        print(f"    the host took {r['run_cpu_stolen']:.0%} of the CPU during the run: again",
              file=sys.stderr)


def limits_lines(lim: dict) -> list[str]:
    c = lim["cpu"]
    return [f"machine: {c['model']}, {c['online_cpus']} CPUs online; L1d {c['l1d_bytes'] >> 10} "
            f"KiB, L2 {c['l2_bytes'] >> 10} KiB, L3 {c['l3_bytes'] >> 20} MiB (as the OS reports "
            f"them); AVX512-BF16 {c['avx512_bf16']}, AVX512-VNNI {c['avx512_vnni']}, "
            f"AMX-INT8 {c.get('amx_int8', False)}",
            f"read bandwidth, {lim['threads']} threads (GB/s by buffer MiB): " + ", ".join(
                f"{k} MiB {v:.1f}" for k, v in sorted(lim["read_gbps"].items(),
                                                       key=lambda kv: int(kv[0]))),
            "oneDNN products {}x{}x{} (GFLOP/s): ".format(*lim["gemm_shape"]) + ", ".join(
                f"{k} {v:.0f}" for k, v in lim["gflops"].items())
            + f"; CPU stolen by the host meanwhile {percent(lim.get('cpu_stolen'))}"]


def percent(share: float | None) -> str:
    """A share as a percentage, or "unknown" (None, or the bench's -1)."""
    return "unknown" if share is None or share < 0 else f"{100 * share:.0f}%"


def read_bandwidth(lim: dict, nbytes: float) -> float:
    """Bytes/s the machine reads a working set of nbytes at: interpolated in log size between
    the measured buffers, flat beyond them (a set in the cache is held to the cache's rate, a
    larger one to DRAM's)."""
    pts = sorted((int(k) << 20, v * 1e9) for k, v in lim["read_gbps"].items())
    if nbytes <= pts[0][0]:
        return pts[0][1]
    for (s0, b0), (s1, b1) in zip(pts, pts[1:]):
        if nbytes <= s1:
            return b0 + math.log(nbytes / s0) / math.log(s1 / s0) * (b1 - b0)
    return pts[-1][1]


def side_format(name: str, r: dict) -> tuple[str, int]:
    """(weight format, bytes per cached key or value element) of one side's result."""
    if name.startswith("ours"):
        return r["cpu_weights"], 2 if r["kv_dtype"] == "bf16" else 4
    dtype, flags = LLAMA[name]
    return dtype, 4 if flags[flags.index("--cache") + 1] == "f32" else 2


def sizes(shape: str) -> tuple[int, int]:
    """(parameters a decode step reads, key elements a cached token holds) of a shape."""
    _, layers, heads, _ = SHAPES[shape]
    return weight_count(shape), layers * heads * 64


def step_bytes(size: tuple[int, int], name: str, r: dict, steps: int) -> tuple[float, float]:
    """(weights, every sequence's keys and values) bytes read in one decode step, of a model of
    `size` (sizes())."""
    params, key_width = size
    wfmt, kvbytes = side_format(name, r)
    kv = 2 * key_width * (r["context"] + steps / 2) * r.get("live_fraction", 1.0)
    return params * WEIGHT_BYTES[wfmt], r["batch"] * kv * kvbytes


def side_bandwidth(lim: dict, nbytes: float, r: dict) -> float:
    """read_bandwidth() for a side's run: past the last-level cache, scaled to the DRAM
    bandwidth measured beside the run (the mean of before and after)."""
    bw = read_bandwidth(lim, nbytes)
    if nbytes <= lim["cpu"]["l3_bytes"] or "dram_gbps" not in r:
        return bw
    return bw * sum(r["dram_gbps"]) / 2 / lim["read_gbps"]["1024"]


def step_limit(size: tuple[int, int], name: str, r: dict, steps: int,
               lim: dict) -> tuple[float, bool]:
    """The least time a decode step can take, and whether the weights' products bound it: the
    products (2 x parameters x batch operations at the product rate of the side's weight format)
    or reading the weights, whichever is longer, then reading the keys and values. The two phases
    follow each other in a step (attention needs the projections), so they add."""
    wbytes, kvbytes = step_bytes(size, name, r, steps)
    bw = side_bandwidth(lim, wbytes + kvbytes, r)
    products = 2 * size[0] * r["batch"] / (lim["gflops"][RATE[side_format(name, r)[0]]] * 1e9)
    reading = wbytes / bw
    return max(reading, products) + kvbytes / bw, products > reading


def decode_fraction(size: tuple[int, int], name: str, r: dict, steps: int, lim: dict) -> float:
    """The least time a step can take (step_limit) times steps/s."""
    return step_limit(size, name, r, steps, lim)[0] * r["tokens_per_s"] / r["batch"]


def prefill_fraction(shape: str, name: str, r: dict, lim: dict) -> float:
    """Matrix FLOPs of a prompt token plus causal attention (q.k and p.v over T/2 keys on
    average; no lm_head: both sides take logits of the last token only) over the product rate
    of the side's weight format."""
    d, layers, heads, ff = SHAPES[shape]
    flops = 2 * layers * (4 * heads * 64 * d + 3 * ff * d) + 4 * layers * heads * 64 * r[
        "context"] / 2
    rate = lim["gflops"][RATE[side_format(name, r)[0]]] * 1e9
    return flops * r["prefill_tokens_per_s"] / rate


def sides(shape: str, batch: int, context: int, models: dict, lib: str, driver: str, a):
    """(name, thunk) for every engine configuration of one case."""
    m = models[shape]
    out = [("ours softmax", lambda: run_ours(a.bench, m["softmax"], batch, context, False, a)),
           ("ours fpa", lambda: run_ours(a.bench, m["fpa"], batch, context, True, a))]
    for name, (dtype, flags) in LLAMA.items():
        out.append((name, lambda d=dtype, f=flags: run_llama(lib, driver, m[d], f, batch,
                                                             context, a)))
    return [(name, lambda run=run: beside_machine(run, a)) for name, run in out]


def best(old: dict | None, new: dict) -> dict:
    """Of two rounds' results for one side and case: the faster decode and the faster prefill."""
    if old is None:
        return new
    out = dict(max(old, new, key=lambda r: r["tokens_per_s"]))
    out["prefill_tokens_per_s"] = max(old["prefill_tokens_per_s"], new["prefill_tokens_per_s"])
    return out


def measure(cases: list[tuple[str, int, int]], sides_of, rounds: int) -> list[dict]:
    """Every case (shape, batch, context), the sides of a case (sides_of(shape, batch, context):
    [(name, thunk)]) back to back in an order that rotates; with rounds N the whole sweep N
    times, each side's best per case kept."""
    rows, turn = {}, 0
    for _ in range(rounds):
        for shape, batch, context in cases:
            todo = sides_of(shape, batch, context)
            turn += 1
            todo = todo[turn % len(todo):] + todo[:turn % len(todo)]
            row = rows.setdefault((shape, batch, context), {
                "shape": shape, "batch": batch, "context": context, "sides": {}})
            for name, thunk in todo:
                row["sides"][name] = best(row["sides"].get(name), thunk())
            print(f"  {shape} batch {batch} context {context}: " + ", ".join(
                f"{k} {v['tokens_per_s']:.0f}" for k, v in row["sides"].items()),
                file=sys.stderr)
    return list(rows.values())


SIDES = ("ours softmax", "ours fpa", *LLAMA)


def decode_cells(r: dict, a, lim: dict) -> tuple[dict, list[str]]:
    """Tokens/s per side, and the cells beyond the ratios: the applicable limit (ours softmax's
    bytes per step and the bandwidth at that size), FPA's speed-up over llama.cpp's fastest
    against the one its bytes allow, each side's fraction of its limit."""
    s = r["sides"]
    v = {k: s[k]["tokens_per_s"] for k in SIDES}
    fastest = max(LLAMA, key=lambda k: v[k])
    size = sizes(r["shape"])
    ours = sum(step_bytes(size, "ours softmax", s["ours softmax"], a.steps))
    allowed = (sum(step_bytes(size, fastest, s[fastest], a.steps))
               / sum(step_bytes(size, "ours fpa", s["ours fpa"], a.steps)))
    bound = step_limit(size, "ours softmax", s["ours softmax"], a.steps, lim)[1]
    frac = [decode_fraction(size, k, s[k], a.steps, lim) for k in SIDES]
    dram = [x for k in SIDES for x in s[k].get("dram_gbps", [])]
    beside = f"; DRAM {min(dram):.0f}-{max(dram):.0f} GB/s beside the runs" if dram else ""
    stolen = [s[k]["run_cpu_stolen"] for k in SIDES if s[k].get("run_cpu_stolen") is not None]
    if stolen:
        beside += f"; CPU stolen by the host {percent(min(stolen))}-{percent(max(stolen))}"
    products = "; its weights' products bound it" if bound else ""
    return v, [f"{ours / 2**20:.0f} MiB at {read_bandwidth(lim, ours) / 1e9:.1f} GB/s{beside}"
               f"{products}",
               f"{v['ours fpa'] / v[fastest] / allowed:.2f} ({allowed:.2f}x allowed)",
               " / ".join(f"{f:.2f}" for f in frac)]


def prefill_cells(r: dict, lim: dict) -> tuple[dict, list[str]]:
    s = r["sides"]
    v = {k: s[k]["prefill_tokens_per_s"] for k in SIDES}
    rate = lim["gflops"][RATE[side_format("ours softmax", s["ours softmax"])[0]]]
    frac = [prefill_fraction(r["shape"], k, s[k], lim) for k in SIDES]
    return v, [f"{rate:.0f} GFLOP/s", "", " / ".join(f"{f:.2f}" for f in frac)]


def table(rows: list[dict], a, lim: dict) -> list[str]:
    first = rows[0]["sides"]["ours softmax"]
    w = f"{first['cpu_weights']} weights, {first['kv_dtype']} cache"
    head = (f"| shape | case | fpa-serve softmax ({w}) | fpa-serve FPA ({w}; live) | "
            "llama.cpp f32 | llama.cpp bf16 | llama.cpp Q8_0 | softmax / llama f32 | "
            "softmax / llama Q8_0 | softmax / llama fastest | FPA / llama fastest | limit "
            "(ours softmax) | FPA speed-up / what its bytes allow | fraction of limit: softmax / "
            "FPA / llama f32 / llama bf16 / llama Q8_0 |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        for kind in ("decode", "prefill") if r["batch"] == 1 else ("decode",):
            if kind == "decode":
                v, cells = decode_cells(r, a, lim)
                case = f"decode b{r['batch']} @{r['context']}"
                live = f" ({r['sides']['ours fpa']['live_fraction']:.2f})"
            else:
                v, cells = prefill_cells(r, lim)
                case, live = f"prefill {r['context']}", ""
            fastest = max(v[k] for k in LLAMA)
            lines.append(
                f"| {r['shape']} | {case} | {v['ours softmax']:.0f} | {v['ours fpa']:.0f}{live} | "
                + " | ".join(f"{v[k]:.0f}" for k in LLAMA) + " | "
                f"{v['ours softmax'] / v['llama f32']:.2f}x | "
                f"{v['ours softmax'] / v['llama q8_0']:.2f}x | "
                f"{v['ours softmax'] / fastest:.2f}x | "
                f"{v['ours fpa'] / fastest:.2f}x | " + " | ".join(cells) + " |")
    return lines


WEIGHT_PHASES = ("project", "output", "mlp", "logits")


def phase_table(rows: list[dict], a) -> list[str]:
    """Where ours' decode steps went (the bench's phase_ms, a mean over all timed steps): the
    attention's and the products' read rates from the bytes step_bytes counts, beside the DRAM
    read measured around the run; what bounds a case missed."""
    head = ("| shape | case | side | step ms (mean) | attention ms (keys and values GB/s) | "
            "products ms (weights GB/s) | cache update ms | field walk + page lists ms | "
            "DRAM GB/s beside | CPU stolen by the host |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        for name in ("ours softmax", "ours fpa"):
            s = r["sides"].get(name, {})
            if "phase_ms" not in s:
                continue
            ph = s["phase_ms"]
            wbytes, kvbytes = step_bytes(sizes(r["shape"]), name, s, a.steps)
            products = sum(ph[k] for k in WEIGHT_PHASES)
            dram = s.get("dram_gbps", [0.0])
            attend = ph["attend"]
            lines.append(
                f"| {r['shape']} | b{r['batch']} @{r['context']} | {name} | "
                f"{sum(ph.values()):.1f} | {attend:.1f} ({kvbytes / attend / 1e6:.1f}) | "
                f"{products:.1f} ({wbytes / products / 1e6:.1f}) | {ph['cache']:.1f} | "
                f"{ph['field'] + ph['pages']:.1f} | {sum(dram) / len(dram):.1f} | "
                f"{percent(s.get('run_cpu_stolen'))} |")
    return lines


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bench", help="fpa-decode-bench binary (default: newest build*/bench/)")
    ap.add_argument("--out", default=os.path.join(HERE, "out", "llama_cpp"))
    ap.add_argument("--shapes", nargs="+", choices=list(SHAPES), default=["tiny", "25m", "85m"])
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--windows", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=1,
                    help="sweeps over all cases; each side's fastest per case is reported")
    ap.add_argument("--no-check", action="store_true", help="skip the logits check")
    ap.add_argument("--ours-weights", choices=("f32", "bf16", "int8", "auto"), default="f32",
                    help="fpa-serve's CPU projection weights (--cpu_weights of the bench)")
    ap.add_argument("--ours-kv", choices=("f32", "bf16", "auto"), default="f32",
                    help="fpa-serve's KV cache pages (--kv_dtype of the bench)")
    ap.add_argument("--max-stolen", type=float, default=0.05,
                    help="a side's run that lost more of the CPU to the host is run again")
    ap.add_argument("--stolen-retries", type=int, default=2,
                    help="how many times at most a side's run is repeated for --max-stolen")
    ap.add_argument("--cases", nargs="+", metavar="BATCHxCONTEXT",
                    default=[f"{b}x{c}" for b, c in CASES],
                    help="decode cases (prefill figures come from the batch-1 ones)")
    ap.add_argument("--smoke", action="store_true",
                    help="the tiny shape, 8 steps, batch 1 and 8 at 512, no logits check: that "
                         "everything runs (the figures mean nothing)")
    a = ap.parse_args()
    a.cases = [tuple(int(x) for x in case.split("x")) for case in a.cases]
    if a.smoke:
        a.shapes, a.steps, a.windows, a.rounds, a.no_check = ["tiny"], 8, 2, 1, True
        a.stolen_retries = 0
        a.cases = CASES[:2]
    a.bench = find_bench(a.bench)
    if not shutil.which("npm") or not shutil.which("g++"):
        sys.exit("needs npm and g++")
    t0 = time.time()
    lib, driver = setup_llama(a.out)
    models = write_models(a.out, sorted(set(a.shapes) | {"tiny"}, key=list(SHAPES).index))
    print(f"date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; load average at start "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}; {platform.node()}")
    with open(os.path.join(lib, "_nlcBuildMetadata.json")) as f:
        release = json.load(f)["buildOptions"]["llamaCpp"]["release"]
    print(f"fpa-serve: {a.bench}; llama.cpp: @node-llama-cpp/linux-x64@{NPM_VERSION} "
          f"(llama.cpp release {release})")
    lim = machine_limits(a.bench, a.threads)
    print("\n".join(limits_lines(lim)))
    if not a.no_check:
        for line in check_logits(lib, driver, a.out):
            print(line)
    rows = measure([(shape, b, c) for shape in a.shapes for b, c in a.cases],
                   lambda shape, b, c: sides(shape, b, c, models, lib, driver, a), a.rounds)
    end = machine_limits(a.bench, a.threads, "--read_mib=4")["gflops"]
    print("oneDNN products again at the end (GFLOP/s): " + ", ".join(
        f"{k} {v:.0f}" for k, v in end.items()) + "; each format's faster probe is the limit")
    lim["gflops"] = {k: max(v, end[k]) for k, v in lim["gflops"].items()}
    variant = rows[0]["sides"]["llama f32"]["cpu_variant"]
    print(f"\nllama.cpp CPU backend: {variant}; {a.threads} threads each side; {a.steps} timed "
          f"decode steps in {a.windows} windows, the fastest window's rate; best of {a.rounds} "
          f"round(s) per side and case; load average at end "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}; wall {time.time() - t0:.0f} s\n")
    print("\n".join(table(rows, a, lim)))
    print("\nWhere ours' decode steps went\n")
    print("\n".join(phase_table(rows, a)))
    with open(os.path.join(a.out, "results.json"), "w") as f:
        json.dump({"limits": lim, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
