"""Soak: about a minute of mixed clients against one daemon, over gRPC (random prompts and
policies, bad requests, cancellations, deadlines, stalled and vanished readers) and HTTP at once
(plain and SSE completions, streams abandoned midway, pipelined HTTP/1.1 requests; soak_http.py).
Every call must end with a status that /metrics counts, every HTTP request must be answered, the
cache and the queue must drain to zero, resident memory must stay flat in the second half,
SIGTERM must end the process within --drain-seconds, and the log must hold no sanitizer report.

FPA_SOAK_SECONDS sets the load phase (default 40); ctest runs this once against the Release
daemon and once against an ASan+UBSan build of it (server_soak_asan)."""
import collections
import os
import random
import signal
import threading
import time

import grpc

import soak_http
from conftest import fpa_client

pb, pb_grpc = fpa_client.pb, fpa_client.pb_grpc
LOAD_SECONDS = float(os.environ.get("FPA_SOAK_SECONDS", "40"))
DRAIN_SECONDS = 3
POLICIES = ["", "fpa", "none", "window", "sinks", "h2o", "snapkv", "tova"]
# Codes only the server produces: a client that saw one knows its call was counted.
SERVER_CODES = {"OK", "INVALID_ARGUMENT", "RESOURCE_EXHAUSTED"}
# What ASan, LeakSanitizer and UBSan write (the ASan daemon of server_soak_asan).
SANITIZER_REPORTS = ["ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error:"]


class Tally:
    """What the clients saw: calls started, calls certainly received, final codes."""

    def __init__(self):
        self.lock = threading.Lock()
        self.started = 0
        self.received = 0
        self.codes = collections.Counter()
        self.actions = collections.Counter()

    def began(self, action: str):
        with self.lock:
            self.actions[action] += 1

    def record(self, code: str, received: bool):
        with self.lock:
            self.started += 1
            self.received += received or code in SERVER_CODES
            self.codes[code] += 1


def random_request(rng: random.Random, long: bool = False):
    if rng.random() < 0.3:
        prompt = [256] + [rng.randrange(256) for _ in range(rng.randint(0, 200))]
    else:
        prompt = "".join(rng.choice("abc \u00e9\u2603\n.,xyz") for _ in range(rng.randint(1, 300)))
    fields = dict(max_new_tokens=rng.randint(300, 2000) if long else rng.randint(1, 48),
                  temperature=rng.choice([0.0, 0.7, 1.0]), logprobs=rng.random() < 0.5,
                  eviction_policy=rng.choice(POLICIES), ignore_eos=rng.random() < 0.5)
    if fields["eviction_policy"] in ("window", "sinks", "h2o", "snapkv", "tova"):
        fields["cache_budget_fraction"] = rng.choice([0.1, 0.5, 1.0])
    if fields["eviction_policy"] == "fpa":
        fields["tau"] = rng.choice([2.0, 8.0, 20.0])
    if rng.random() < 0.08:  # a bad field
        field, value = rng.choice([("top_p", 2.0), ("max_new_tokens", 0), ("tau", -1.0)])
        fields[field] = value
    return fpa_client.make_request(prompt, **fields)


def code_of(e: grpc.RpcError) -> str:
    return e.code().name


def run_stream(call, tally: Tally, stop_after=None, then=None):
    """Reads `call` to its end, or `stop_after` messages and then calls `then()`."""
    got = 0
    try:
        for _ in call:
            got += 1
            if stop_after is not None and got >= stop_after:
                then()
                tally.record("CLIENT_ENDED", received=True)
                return
        tally.record("OK", received=True)
    except grpc.RpcError as e:
        tally.record(code_of(e), received=got > 0)


def client(address: str, http_port: int, seed: int, tally: Tally, stop_at: float):
    rng = random.Random(seed)
    channel = grpc.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)])
    stub = pb_grpc.FpaServiceStub(channel)
    while time.time() < stop_at:
        action = rng.choice(["unary", "stream", "cancel", "deadline", "stall", "vanish", "bytes"] +
                            soak_http.ACTIONS)
        tally.began(action)
        if action in soak_http.ACTIONS:
            soak_http.client(http_port, action, rng, tally)
        elif action == "unary":
            try:
                stub.Generate(random_request(rng), timeout=60)
                tally.record("OK", received=True)
            except grpc.RpcError as e:
                tally.record(code_of(e), received=False)
        elif action == "stream":
            run_stream(stub.GenerateStream(random_request(rng), timeout=60), tally)
        elif action == "cancel":
            call = stub.GenerateStream(random_request(rng, long=True), timeout=60)
            run_stream(call, tally, stop_after=rng.randint(1, 20), then=call.cancel)
        elif action == "deadline":
            call = stub.GenerateStream(random_request(rng, long=True),
                                       timeout=rng.uniform(0.05, 1.0))
            run_stream(call, tally)
        elif action == "stall":
            stalled(address, rng, tally)
        elif action == "vanish":
            vanished(address, rng, tally)
        else:
            data = bytes(rng.randrange(256) for _ in range(rng.randint(1, 64)))
            try:
                channel.unary_unary("/fpa.v1.FpaService/Generate")(data, timeout=30)
                tally.record("OK", received=True)
            except grpc.RpcError as e:
                tally.record(code_of(e), received=False)
    channel.close()


def stalled(address: str, rng: random.Random, tally: Tally):
    """A reader with a tiny window that stops reading, then cancels."""
    channel = grpc.insecure_channel(address, options=[
        ("grpc.use_local_subchannel_pool", 1), ("grpc.http2.bdp_probe", 0),
        ("grpc.http2.lookahead_bytes", 1024)])
    req = random_request(rng, long=True)
    req.logprobs = True
    call = pb_grpc.FpaServiceStub(channel).GenerateStream(req, timeout=60)
    run_stream(call, tally, stop_after=1, then=lambda: (time.sleep(rng.uniform(0.2, 2)),
                                                         call.cancel()))
    channel.close()


def vanished(address: str, rng: random.Random, tally: Tally):
    """A reader whose connection goes away mid-stream."""
    channel = grpc.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)])
    call = pb_grpc.FpaServiceStub(channel).GenerateStream(random_request(rng, long=True),
                                                          timeout=60)
    run_stream(call, tally, stop_after=1, then=channel.close)


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def counted(server) -> collections.Counter:
    out = collections.Counter()
    for k, v in server.metrics().items():
        if k.startswith('fpa_requests_total{code="'):
            out[k.split('"')[1]] = int(v)
    return out


def test_soak(make_server):
    s = make_server("--max-batch", "8", "--max-queue", "16", "--max-new-tokens", "2048",
                    "--drain-seconds", str(DRAIN_SECONDS), "--cache-pages", "4096")
    before = counted(s)
    tally = Tally()
    start = time.time()
    stop_at = start + LOAD_SECONDS
    workers = [threading.Thread(target=client,
                                args=(s.address, s.http_port(), seed, tally, stop_at))
               for seed in range(8)]
    for w in workers:
        w.start()
    rss = []
    while any(w.is_alive() for w in workers):
        assert s.proc.poll() is None, f"fpa-serve died:\n{s.output()[-4000:]}"
        rss.append((time.time() - start, rss_kib(s.proc.pid)))
        time.sleep(0.5)
    for w in workers:
        w.join()

    deadline = time.time() + 20
    while True:
        st = s.client.cache_stats()
        if st.requests_running == st.requests_waiting == st.pages_in_use == st.sequences == 0:
            break
        assert time.time() < deadline, f"did not drain: {st}"
        time.sleep(0.1)
    m = s.metrics()
    assert m["fpa_requests_running"] == m["fpa_requests_waiting"] == 0
    assert m["fpa_cache_pages_in_use"] == 0

    delta = counted(s) - before
    total = sum(delta.values())
    print(f"soak: {tally.started} calls, {tally.received} certainly received, server counted "
          f"{total}: {dict(delta)}; clients saw {dict(tally.codes)}; actions {dict(tally.actions)}")
    assert tally.started > 200
    assert not [c for c in tally.codes if c.startswith("HTTP_")], "HTTP requests unanswered"
    assert tally.received <= total <= tally.started  # every received call was counted
    for code in ("INVALID_ARGUMENT", "RESOURCE_EXHAUSTED"):
        assert delta[code] == tally.codes[code], code
    assert delta["OK"] >= tally.codes["OK"]

    half = [kib for t, kib in rss if t >= LOAD_SECONDS / 2]
    print(f"soak: RSS {rss[0][1] // 1024} MiB at start, {half[0] // 1024} MiB at half time, "
          f"max {max(half) // 1024} MiB in the second half")
    assert max(half) <= half[0] * 1.15 + 16 * 1024, "resident memory grows in the second half"

    long_calls = [s.client.stream("drain me", max_new_tokens=2048, ignore_eos=True)
                  for _ in range(3)]
    for c in long_calls:
        next(c)
    sent = time.time()
    s.proc.send_signal(signal.SIGTERM)
    assert s.proc.wait(timeout=DRAIN_SECONDS + 10) == 0
    # --drain-seconds for the scheduler, then at most 2 s for gRPC to close the connections.
    assert time.time() - sent < DRAIN_SECONDS + 3, "SIGTERM took longer than --drain-seconds"
    for c in long_calls:
        c.cancel()
    reports = [m for m in SANITIZER_REPORTS if m in s.output()]
    assert not reports, s.output()[-4000:]


PRESSURE_SECONDS = LOAD_SECONDS / 2


def pressure_client(address: str, seed: int, stop_at: float, usages: list):
    """Plain requests of every policy, long enough that eight of them outgrow the pool."""
    rng = random.Random(seed)
    stub = pb_grpc.FpaServiceStub(grpc.insecure_channel(address))
    while time.time() < stop_at:
        req = random_request(rng)
        req.max_new_tokens = rng.randint(100, 400)
        if req.eviction_policy == "fpa":
            req.tau = 2.0  # small: keys are evicted, so recomputing them must match
        try:
            usages.append(stub.Generate(req, timeout=120).usage)
        except grpc.RpcError as e:
            assert e.code().name in ("INVALID_ARGUMENT",), e


def test_soak_under_memory_pressure(make_server):
    """Eight clients on a pool that holds about half of what they grow to: requests are
    preempted, but none thrashes: recomputed tokens stay at most half of the generated ones and
    no request is preempted more than 3 times."""
    s = make_server("--max-batch", "8", "--cache-pages", "512", "--max-new-tokens", "512")
    usages = []
    stop_at = time.time() + PRESSURE_SECONDS
    workers = [threading.Thread(target=pressure_client, args=(s.address, seed, stop_at, usages))
               for seed in range(8)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert s.proc.poll() is None, f"fpa-serve died:\n{s.output()[-4000:]}"
    generated = sum(u.generated_tokens for u in usages)
    recomputed = sum(u.recomputed_tokens for u in usages)
    most = max((u.preemptions for u in usages), default=0)
    m = s.metrics()
    print(f"soak under pressure: {len(usages)} requests, {generated} tokens generated, "
          f"{recomputed} recomputed, {int(m['fpa_preemptions_total'])} preemptions, "
          f"at most {most} for one request")
    assert len(usages) >= 8
    assert m["fpa_preemptions_total"] > 0, "the pool did not force preemption"
    assert recomputed <= generated / 2
    assert most <= 3
