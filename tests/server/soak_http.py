"""The soak's HTTP clients (test_soak.py): OpenAI completions against the daemon's HTTP port, plain
and streamed (SSE), streams abandoned midway, and requests pipelined on one HTTP/1.1 connection.
Each call is recorded in the soak's tally under the gRPC code name the server counts it as."""
import json
import random
import socket

# HTTP status -> the code /metrics counts (server/openai/openai_request.cc's api_error, inverted).
CODES = {200: "OK", 400: "INVALID_ARGUMENT", 429: "RESOURCE_EXHAUSTED", 503: "UNAVAILABLE",
         504: "DEADLINE_EXCEEDED"}
ACTIONS = ["http", "http_stream", "http_vanish", "http_pipeline"]


def body(rng: random.Random, stream: bool = False, long: bool = False) -> bytes:
    fields = {"prompt": "".join(rng.choice("abc \u00e9\u2603\n.,xyz")
                                for _ in range(rng.randint(1, 300))),
              "max_tokens": rng.randint(300, 2000) if long else rng.randint(1, 48),
              "temperature": rng.choice([0.0, 0.7, 1.0]), "stream": stream}
    if rng.random() < 0.5:
        fields["messages"] = [{"role": "user", "content": fields.pop("prompt")}]
    if rng.random() < 0.08:  # a bad field
        fields["top_p"] = 2.0
    return json.dumps(fields).encode()


def request(data: bytes, close: bool = True) -> bytes:
    path = "/v1/chat/completions" if b'"messages"' in data else "/v1/completions"
    close_field = "Connection: close\r\n" if close else ""
    return (f"POST {path} HTTP/1.1\r\nHost: soak\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\n{close_field}\r\n").encode() + data


def read_head(f) -> tuple[int, dict]:
    """Status and headers of the next response on `f`; EOFError if the server closed."""
    line = f.readline()
    if not line:
        raise EOFError
    status = int(line.split()[1])
    headers = {}
    while (line := f.readline()) not in (b"\r\n", b""):
        name, _, value = line.decode().partition(":")
        headers[name.strip().lower()] = value.strip()
    return status, headers


def read_events(f, stop_after=None) -> int:
    """Reads a chunked SSE body to "data: [DONE]" (or `stop_after` events); the events read."""
    events = 0
    while True:
        size = int(f.readline().split(b";")[0], 16)
        if size == 0:
            return events
        data = f.read(size + 2)
        events += data.count(b"data: ")
        if stop_after is not None and events >= stop_after:
            return events


def plain(port: int, rng: random.Random, tally, pipelined: int = 1):
    """`pipelined` requests sent at once on one connection, then their answers read in order."""
    bodies = [body(rng) for _ in range(pipelined)]
    raw = b"".join(request(b, close=i == pipelined - 1) for i, b in enumerate(bodies))
    answered = 0
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=120) as sock:
            sock.sendall(raw)
            f = sock.makefile("rb")
            for _ in bodies:
                status, headers = read_head(f)
                f.read(int(headers["content-length"]))
                answered += 1
                tally.record(CODES.get(status, f"HTTP_{status}"), received=True)
    except (OSError, EOFError, ValueError):
        pass
    for _ in range(pipelined - answered):
        tally.record("HTTP_UNANSWERED", received=False)


def streamed(port: int, rng: random.Random, tally, vanish: bool):
    """An SSE completion read to its end, or (`vanish`) abandoned after a few events."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=120) as sock:
            sock.sendall(request(body(rng, stream=True, long=vanish)))
            f = sock.makefile("rb")
            status, headers = read_head(f)
            if status != 200:
                f.read(int(headers["content-length"]))
                return tally.record(CODES.get(status, f"HTTP_{status}"), received=True)
            read_events(f, stop_after=rng.randint(1, 10) if vanish else None)
            tally.record("CLIENT_ENDED" if vanish else "OK", received=True)
    except (OSError, EOFError, ValueError):
        tally.record("HTTP_UNANSWERED", received=False)


def client(port: int, action: str, rng: random.Random, tally):
    if action == "http":
        plain(port, rng, tally)
    elif action == "http_pipeline":
        plain(port, rng, tally, pipelined=rng.randint(2, 4))
    else:
        streamed(port, rng, tally, vanish=action == "http_vanish")
