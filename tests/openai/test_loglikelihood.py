"""lm-evaluation-harness's loglikelihood through the OpenAI API, against the PyTorch reference.

lm-eval's "local-completions" model sends each (context, continuation) as one token prompt with
echo=true, max_tokens=0 (or 1), logprobs=1 and temperature 0, then sums the last len(continuation)
token_logprobs and calls the pair greedy when each continuation token tops its position's
top_logprobs. Both must equal the reference model's (train/reference.py) within 1e-4. The same
reference checks greedy decoding under vLLM's penalties. Run with FPA_SERVE_BIN set (ctest does).
"""
import json
import os
import re
import subprocess
import sys
import urllib.request

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "train"))
from export import load_model  # noqa: E402
from reference import encode  # noqa: E402

MODEL_DIR = os.path.join(ROOT, "models/fpa-v2")  # scripts/serve's default model
PAIRS = [
    ("The grass is green. The sky is", " blue."),
    ("The pass key is 7261. Remember it. The pass key is", " 7261"),
    ("One, two, three, four,", " five"),
    ("The sun is yellow and the", " sky is blue."),
]


def start_server():
    binary = os.environ.get("FPA_SERVE_BIN", os.path.join(ROOT, "build/server/fpa-serve"))
    proc = subprocess.Popen(
        [binary, "--model", MODEL_DIR, "--address", "127.0.0.1:0", "--metrics-address",
         "127.0.0.1:0", "--http-address", "127.0.0.1:0", "--threads", "1",
         # compared with the float32 reference: float32 weights and pages, not the default int8
         "--cpu-weights", "f32", "--kv-dtype", "f32"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    log = ""
    for line in proc.stdout:
        log += line
        if m := re.search(r":(\d+) \(http\)", line):
            return proc, f"http://127.0.0.1:{m.group(1)}"
    raise RuntimeError(f"fpa-serve did not start:\n{log}")


def complete(base, body):
    req = urllib.request.Request(f"{base}/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.load(r)


def server_loglikelihood(base, context, continuation, max_tokens):
    ctx, cont = encode(context), encode(continuation, bos=False)
    choice = complete(base, {
        "prompt": ctx + cont, "echo": True, "max_tokens": max_tokens, "logprobs": 1,
        "temperature": 0, "eviction_policy": "none"})["choices"][0]
    lp = choice["logprobs"]
    n = len(ctx) + len(cont)  # with max_tokens 1 a generated token follows: not counted
    assert len(lp["token_logprobs"]) == n + max_tokens and lp["token_logprobs"][0] is None
    total = sum(lp["token_logprobs"][n - len(cont):n])
    greedy = True
    for i in range(n - len(cont), n):
        top = max(lp["top_logprobs"][i].items(), key=lambda kv: kv[1])[0]
        greedy &= top == lp["tokens"][i]
    return total, greedy


def reference_loglikelihood(model, context, continuation):
    ctx, cont = encode(context), encode(continuation, bos=False)
    tokens = torch.tensor([ctx + cont])
    with torch.no_grad():
        logp = torch.log_softmax(model(tokens)[0].double(), dim=-1)
    rows = logp[len(ctx) - 1:-1]  # row i predicts token i + 1
    target = torch.tensor(cont)
    total = rows[torch.arange(len(cont)), target].sum().item()
    return total, bool((rows.argmax(-1) == target).all())


def reference_penalized_greedy(model, prompt, steps, repetition, presence, frequency):
    out = []
    with torch.no_grad():
        for _ in range(steps):
            logits = model(torch.tensor([prompt + out]))[0, -1].double()
            for t in set(prompt + out):  # Hugging Face's repetition rule
                logits[t] = logits[t] / repetition if logits[t] > 0 else logits[t] * repetition
            for t in set(out):  # OpenAI's presence and frequency rules
                logits[t] -= presence + frequency * out.count(t)
            out.append(int(logits.argmax()))
    return out


def token_string(t):
    """The server's spelling of a byte-tokenizer id in logprobs.tokens."""
    if t >= 256:
        return f"<special:{t}>"
    return chr(t) if t < 0x80 else f"bytes:\\x{t:02X}"


def main():
    torch.set_num_threads(1)
    model = load_model(MODEL_DIR)
    proc, base = start_server()
    try:
        for context, continuation in PAIRS:
            want = reference_loglikelihood(model, context, continuation)
            for max_tokens in (0, 1):
                got = server_loglikelihood(base, context, continuation, max_tokens)
                print(f"{context!r} + {continuation!r} max_tokens={max_tokens}: "
                      f"server {got[0]:.6f} {got[1]}, reference {want[0]:.6f} {want[1]}")
                assert abs(got[0] - want[0]) < 1e-4 and got[1] == want[1], (got, want)
        prompt = encode("The grass is green. The grass is green. The")
        for rules in ((1.3, 0.0, 0.0), (1.0, 0.8, 0.4), (0.9, -0.5, 2.0)):
            got = complete(base, {
                "prompt": prompt, "max_tokens": 24, "temperature": 0, "ignore_eos": True,
                "eviction_policy": "none", "repetition_penalty": rules[0],
                "presence_penalty": rules[1], "frequency_penalty": rules[2], "logprobs": 0,
            })["choices"][0]["logprobs"]["tokens"]
            want = reference_penalized_greedy(model, prompt, 24, *rules)
            plain = reference_penalized_greedy(model, prompt, 24, 1.0, 0.0, 0.0)
            print(f"penalties {rules}: server {got}\n  reference {want}")
            assert got == [token_string(t) for t in want], (got, want)
            assert want != plain, "the penalties change nothing on this prompt"
    finally:
        proc.kill()
    print("ok")


if __name__ == "__main__":
    main()
