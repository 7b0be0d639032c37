#!/usr/bin/python3
"""Asks a running fpa-serve for one completion over HTTP and one over gRPC.

    ask_server.py GRPC_PORT HTTP_PORT CLIENT_DIR   (CLIENT_DIR: the repository's client/)
Exit 0 when both answer with generated tokens."""
import json
import sys
import urllib.request


def ask_http(port):
    body = json.dumps({"prompt": "The pass key is", "max_tokens": 8, "temperature": 0}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body,
                                 headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as resp:
        answer = json.load(resp)
    assert answer["usage"]["completion_tokens"] > 0, answer
    return answer["choices"][0]["text"]


def ask_grpc(port, client_dir):
    sys.path.insert(0, client_dir)
    from fpa_client import FpaClient
    resp = FpaClient(f"127.0.0.1:{port}", timeout=120).generate("The pass key is",
                                                                max_new_tokens=8)
    assert resp.usage.generated_tokens > 0, resp
    return resp.text


def main():
    grpc_port, http_port, client_dir = sys.argv[1:4]
    print(f"HTTP completion: {ask_http(http_port)!r}")
    print(f"gRPC completion: {ask_grpc(grpc_port, client_dir)!r}")


if __name__ == "__main__":
    main()
