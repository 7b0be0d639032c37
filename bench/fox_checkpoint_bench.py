"""Issue 25's benchmark: a 760M-shaped FoX Pro directory (random weights, bf16, the published
Hugging Face format) served on the CPU, beside llama.cpp on a Llama of the same shape.

    /usr/bin/python3 bench/fox_checkpoint_bench.py [--shape 760m|tiny] [--out DIR]
        [--bench build/bench/fpa-decode-bench] [--context 512] [--batch 1 8] [--steps 64]
        [--windows 8] [--rounds 2] [--threads 2] [--live-tokens 4096]
        [--ours-weights auto] [--ours-kv auto] [--prepare] [--smoke]

What it does; the models are made once under --out (bench/out/fox_checkpoint/, git-ignored):
  1. Models: fox-pro-SHAPE/, bench/make_fox_checkpoint.py's directory; llama-SHAPE/, a Llama of
     the same shape (hidden, layers, heads, d_ff by the published hidden_ratio rule, vocab, untied
     head; RoPE theta 10000 as llama_cpp_compare's), random weights (llama_cpp_compare's
     save_random), in fpa-serve/1 and as GGUF bf16 and Q8_0 (llama-SHAPE-bf16.gguf, -q8_0.gguf).
     --prepare stops here: the files of a later measuring run, made ahead (nothing is timed).
  2. Serving: fpa-serve --model fox-pro-SHAPE on the CPU backend, --cpu-weights and --kv-dtype as
     --ours-weights/--ours-kv (default auto, fpa-serve's defaults; its log says what auto
     picked), a KV pool that holds --live-tokens: seconds from process start to its listening
     line, VmRSS and VmHWM then; one /v1/completions request of --live-tokens tokens in all
     (bench_token's stream as the prompt, the last 16 decoded with ignore_eos), whose
     usage.live_fraction is the share of keys fox eviction at the model's tau keeps; VmRSS and
     VmHWM after it.
  3. Decode: fpa-decode-bench on fox-pro-SHAPE (the same formats; eviction on at tau, as
     fpa-serve's default policy) and llama.cpp (llama_cpp_compare's driver and its bf16 and Q8_0
     configurations) at each --batch, context --context, interleaved in an order that rotates
     (llama_cpp_compare.measure), the same token streams (bench/decode_tokens.h), the fastest
     window, best of --rounds; each side's fraction of the machine's read bandwidth at the bytes
     its step reads (llama_cpp_compare.decode_fraction, each side's own parameter count: FoX Pro
     has the output gate, the shifts and the forget gate beside a Llama's projections).
  4. Prints the machine (build/bench/fpa-machine-limits), the date, the load average at start and
     end, the command line, and two markdown tables for bench/RESULTS.md.
The weights are random: the share of keys eviction keeps follows from the forget gates' bias (4
in make_fox_checkpoint, a slow decay), not from anything learned. --smoke: the tiny shape, a few
steps, one round: that everything runs; its figures mean nothing.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import shlex
import subprocess
import sys
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "train"))
import make_fox_checkpoint  # noqa: E402
import safetensors_io  # noqa: E402
from decode_compare import find_bench  # noqa: E402
from decode_reference import bench_token  # noqa: E402
from llama_cpp_compare import (  # noqa: E402
    LLAMA, NPM_VERSION, decode_fraction, limits_lines, machine_limits, measure, run_llama,
    run_ours, save_random, setup_llama, step_bytes, write_ggufs)

LLAMA_SIDES = ("llama bf16", "llama q8_0")
DECODED = 16  # tokens the serving request decodes after its prompt


def gib(kib: int) -> str:
    return f"{kib / 2**20:.2f} GiB"


def fox_config(fox_dir: str) -> dict:
    with open(os.path.join(fox_dir, "config.json")) as f:
        return json.load(f)


def llama_config(fox: dict):
    """train/reference.py's Config of a softmax Llama with the FoX Pro directory's shape."""
    from reference import Config
    h, heads = fox["hidden_size"], fox["num_heads"]
    return Config(d_model=h, n_layers=fox["num_hidden_layers"], n_heads=heads, head_dim=h // heads,
                  d_ff=make_fox_checkpoint.d_ff(h, fox["hidden_ratio"]), attention="softmax",
                  levels="tied", rope_theta=10000.0, norm_eps=fox["norm_eps"],
                  vocab_size=fox["vocab_size"], tie_embeddings=fox["tie_word_embeddings"])


def prepare(a) -> tuple[str, str, dict]:
    """(FoX Pro dir, Llama dir, {dtype: GGUF}), each written unless there."""
    fox_dir = os.path.join(a.out, f"fox-pro-{a.shape}")
    # make_fox_checkpoint writes the tokenizer files last: their presence means a whole directory.
    if not os.path.exists(os.path.join(fox_dir, "tokenizer_config.json")):
        make_fox_checkpoint.write_checkpoint(fox_dir, a.shape, a.gpt2)
    stem = os.path.join(a.out, f"llama-{a.shape}")
    llama_dir = save_random(stem, llama_config(fox_config(fox_dir)))
    return fox_dir, llama_dir, write_ggufs(llama_dir, stem, [LLAMA[s][0] for s in LLAMA_SIDES])


def params_read(model_dir: str, embedding: str, tied: bool) -> int:
    """Parameters a decode step reads: every tensor but the embedding (a gather of one row per
    token), unless the head is the embedding."""
    h = safetensors_io.header(os.path.join(model_dir, "model.safetensors"))
    return sum(math.prod(t["shape"]) for name, t in h.items() if tied or name != embedding)


def memory(pid: int) -> dict:
    """VmRSS and VmHWM of a process, KiB."""
    with open(f"/proc/{pid}/status") as f:
        return {k: int(v.split()[0]) for k, v in (line.split(":", 1) for line in f)
                if k in ("VmRSS", "VmHWM")}


def complete(port: str, tokens: int) -> dict:
    """One /v1/completions request of `tokens` tokens in all; its usage."""
    body = {"prompt": [bench_token(0, p) for p in range(tokens - DECODED)],
            "max_tokens": DECODED, "ignore_eos": True, "temperature": 0}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions",
                                 json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=3600) as r:
        return json.load(r)["usage"]


def serve(serve_bin: str, fox_dir: str, a) -> dict:
    """fpa-serve on fox_dir: load seconds, its log up to listening, memory after load and after
    one request of --live-tokens tokens, that request's usage."""
    c = fox_config(fox_dir)
    # Every layer's and head's keys of the request in 16-slot pages, and a few pages to spare.
    pages = c["num_hidden_layers"] * c["num_heads"] * (a.live_tokens // 16 + 4)
    cmd = [serve_bin, "--model", fox_dir, "--backend", "cpu", "--address", "127.0.0.1:0",
           "--metrics-address", "127.0.0.1:0", "--http-address", "127.0.0.1:0",
           "--threads", str(a.threads), "--cpu-weights", a.ours_weights, "--kv-dtype", a.ours_kv,
           "--page-slots", "16", "--cache-pages", str(pages)]
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    try:
        log = []
        for line in proc.stdout:
            log.append(line.rstrip())
            if "listening on" in line:
                break
        else:
            sys.exit(f"fpa-serve exited ({proc.wait()}): {shlex.join(cmd)}\n" + "\n".join(log))
        out = {"load_s": time.monotonic() - t0, "log": log, "loaded": memory(proc.pid),
               "cmd": shlex.join(cmd), "pages": pages}
        out["usage"] = complete(re.search(r":(\d+) \(http\)", log[-1]).group(1), a.live_tokens)
        out["after"] = memory(proc.pid)
        return out
    finally:
        proc.terminate()
        proc.wait()


def decode_sides(fox_dir: str, ggufs: dict, lib: str, driver: str, a):
    """llama_cpp_compare.measure's sides_of: fpa-serve's engine on the FoX Pro directory, llama.cpp
    on the same-shape GGUFs."""
    def sides(_shape, batch, context):
        out = [("ours fox", lambda: run_ours(a.bench, fox_dir, batch, context, True, a))]
        for name in LLAMA_SIDES:
            dtype, flags = LLAMA[name]
            out.append((name, lambda d=dtype, f=flags: run_llama(lib, driver, ggufs[d], f, batch,
                                                                 context, a)))
        return out
    return sides


def serving_table(s: dict, fox_dir: str, fox_bytes: int) -> list[str]:
    c, u = fox_config(fox_dir), s["usage"]
    picked = next((line.split("fpa-serve: ", 1)[1] for line in s["log"] if "cpu weights" in line),
                  "(not logged)")
    d_ff = make_fox_checkpoint.d_ff(c["hidden_size"], c["hidden_ratio"])
    return [
        "| fpa-serve, FoX Pro on the CPU | |", "|---|---|",
        f"| model | {os.path.basename(fox_dir)}: hidden {c['hidden_size']}, "
        f"{c['num_hidden_layers']} layers, {c['num_heads']} heads of "
        f"{c['hidden_size'] // c['num_heads']}, d_ff {d_ff}, vocab {c['vocab_size']}, "
        f"{'tied' if c['tie_word_embeddings'] else 'untied'} head; random weights, bf16 "
        f"safetensors ({fox_bytes / 2**30:.2f} GiB) |",
        f"| formats | {picked} |",
        f"| load: process start to the listening line | {s['load_s']:.1f} s |",
        f"| resident after load | VmRSS {gib(s['loaded']['VmRSS'])}, VmHWM "
        f"{gib(s['loaded']['VmHWM'])} (KV pool: {s['pages']} pages of 16 keys, "
        f"{s['pages'] * 16 // (c['num_hidden_layers'] * c['num_heads'])} tokens) |",
        f"| resident after a {u['total_tokens']}-token request | VmRSS {gib(s['after']['VmRSS'])}, "
        f"VmHWM {gib(s['after']['VmHWM'])} |",
        f"| keys fox eviction keeps at {u['total_tokens']} tokens (prompt {u['prompt_tokens']} + "
        f"{u['completion_tokens']} decoded) | {u['live_fraction']:.3f} (random weights: the "
        f"forget gates' bias decides it) |"]


def decode_table(rows: list[dict], sizes: dict, a, lim: dict) -> list[str]:
    first = rows[0]["sides"]["ours fox"]
    head = (f"| case | fpa-serve FoX Pro ({first['cpu_weights']} weights, {first['kv_dtype']} "
            f"cache, eviction at tau {first['tau']:g}; live) | llama.cpp bf16 | llama.cpp Q8_0 | "
            "FoX / llama bf16 | FoX / llama Q8_0 | MiB read per step: FoX / bf16 / Q8_0 | "
            "fraction of limit: FoX / bf16 / Q8_0 |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    names = ("ours fox", *LLAMA_SIDES)
    for r in rows:
        s = r["sides"]
        v = {k: s[k]["tokens_per_s"] for k in names}
        mib = [sum(step_bytes(sizes[k], k, s[k], a.steps)) / 2**20 for k in names]
        frac = [decode_fraction(sizes[k], k, s[k], a.steps, lim) for k in names]
        lines.append(
            f"| decode b{r['batch']} @{r['context']} | {v['ours fox']:.1f} "
            f"({s['ours fox']['live_fraction']:.2f}) | {v['llama bf16']:.1f} | "
            f"{v['llama q8_0']:.1f} | {v['ours fox'] / v['llama bf16']:.2f}x | "
            f"{v['ours fox'] / v['llama q8_0']:.2f}x | " + " / ".join(f"{m:.0f}" for m in mib)
            + " | " + " / ".join(f"{f:.2f}" for f in frac) + " |")
    return lines


def loadavg() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=list(make_fox_checkpoint.SHAPES), default="760m")
    ap.add_argument("--out", default=os.path.join(HERE, "out", "fox_checkpoint"),
                    help="where the models are made once and results.json goes")
    ap.add_argument("--llama-out", default=os.path.join(HERE, "out", "llama_cpp"),
                    help="llama_cpp_compare's --out: its npm packages and driver")
    ap.add_argument("--gpt2", default=make_fox_checkpoint.GPT2,
                    help="GPT-2's encoder.json and vocab.bpe (make_fox_checkpoint --gpt2)")
    ap.add_argument("--bench", help="fpa-decode-bench binary (default: newest build*/bench/); "
                                    "fpa-serve and fpa-machine-limits are taken beside it")
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--windows", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2,
                    help="sweeps over the cases; each side's fastest per case is reported")
    ap.add_argument("--live-tokens", type=int, default=4096,
                    help="tokens of the serving request whose kept share of keys is reported")
    ap.add_argument("--ours-weights", choices=("f32", "bf16", "int8", "auto"), default="auto",
                    help="fpa-serve's --cpu-weights (its default: auto)")
    ap.add_argument("--ours-kv", choices=("f32", "bf16", "auto"), default="auto",
                    help="fpa-serve's --kv-dtype (its default: auto)")
    ap.add_argument("--prepare", action="store_true",
                    help="make the model files and stop (nothing is timed)")
    ap.add_argument("--smoke", action="store_true",
                    help="the tiny shape, 8 steps, one round: that everything runs (the figures "
                         "mean nothing)")
    a = ap.parse_args()
    command = shlex.join([sys.executable, *sys.argv])
    if a.smoke:
        a.shape, a.steps, a.windows, a.rounds = "tiny", 8, 2, 1
    fox_dir, llama_dir, ggufs = prepare(a)
    if a.prepare:
        print("\n".join([fox_dir, llama_dir, *ggufs.values()]))
        return
    a.bench = find_bench(a.bench)
    build = os.path.dirname(os.path.dirname(a.bench))
    t0 = time.time()
    print(f"command: {command}")
    print(f"date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; load average at start "
          f"{loadavg()}; {platform.node()}")
    lib, driver = setup_llama(a.llama_out)
    with open(os.path.join(lib, "_nlcBuildMetadata.json")) as f:
        release = json.load(f)["buildOptions"]["llamaCpp"]["release"]
    print(f"fpa-serve: {build}; llama.cpp: @node-llama-cpp/linux-x64@{NPM_VERSION} "
          f"(llama.cpp release {release})")
    lim = machine_limits(a.bench, a.threads)
    print("\n".join(limits_lines(lim)))
    served = serve(os.path.join(build, "server", "fpa-serve"), fox_dir, a)
    print(f"fpa-serve: {served['cmd']}\n  " + "\n  ".join(served["log"]), file=sys.stderr)
    rows = measure([(a.shape, b, a.context) for b in a.batch],
                   decode_sides(fox_dir, ggufs, lib, driver, a), a.rounds)
    fox = fox_config(fox_dir)
    key_width = fox["num_hidden_layers"] * fox["hidden_size"]
    fox_params = params_read(fox_dir, "model.embeddings.weight", fox["tie_word_embeddings"])
    llama_params = params_read(llama_dir, "embed.weight", fox["tie_word_embeddings"])
    sizes = {"ours fox": (fox_params, key_width),
             **{k: (llama_params, key_width) for k in LLAMA_SIDES}}
    variant = rows[0]["sides"]["llama bf16"]["cpu_variant"]
    print(f"\nllama.cpp CPU backend: {variant}; {a.threads} threads each side; {a.steps} timed "
          f"decode steps in {a.windows} windows, the fastest window's rate; best of {a.rounds} "
          f"round(s) per side and case; parameters read per step: FoX Pro {fox_params / 1e6:.0f}M, "
          f"Llama {llama_params / 1e6:.0f}M; load average at end {loadavg()}; wall "
          f"{time.time() - t0:.0f} s\n")
    fox_bytes = os.path.getsize(os.path.join(fox_dir, "model.safetensors"))
    print("\n".join(serving_table(served, fox_dir, fox_bytes)) + "\n")
    print("\n".join(decode_table(rows, sizes, a, lim)))
    with open(os.path.join(a.out, f"results-{a.shape}.json"), "w") as f:
        json.dump({"command": command, "limits": lim, "serve": served, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
