"""Bad requests get INVALID_ARGUMENT naming the field; garbage on the port is survived."""
import math
import os
import socket

import grpc
import pytest

from conftest import LONG

BAD = [
    ("empty text", dict(prompt=""), "text"),
    ("empty ids", dict(prompt=[]), "tokens.ids"),
    ("id out of vocab", dict(prompt=[256, 300]), "tokens.ids"),
    ("negative id", dict(prompt=[-1]), "tokens.ids"),
    ("max_new_tokens 0", dict(max_new_tokens=0), "max_new_tokens"),
    ("max_new_tokens negative", dict(max_new_tokens=-5), "max_new_tokens"),
    ("max_new_tokens too big", dict(max_new_tokens=LONG + 1), "max_new_tokens"),
    ("top_p > 1", dict(top_p=1.5), "top_p"),
    ("top_p 0", dict(top_p=0.0), "top_p"),
    ("negative temperature", dict(temperature=-1.0), "temperature"),
    ("nan temperature", dict(temperature=math.nan), "temperature"),
    ("negative top_k", dict(top_k=-3), "top_k"),
    ("unknown policy", dict(eviction_policy="lru"), "eviction_policy"),
    ("negative tau", dict(tau=-1.0), "tau"),
    ("budget 0", dict(cache_budget_fraction=0.0), "cache_budget_fraction"),
    ("empty stop", dict(stop=[""]), "stop"),
    ("oversized prompt", dict(prompt="x" * 3000), "text"),
    ("8000-byte policy", dict(eviction_policy="\u00e9" * 4000), "eviction_policy"),
    ("sinks fill the budget", dict(eviction_policy="sinks", sink_tokens=8), "sink_tokens"),
    ("snapkv window 0", dict(eviction_policy="snapkv", snapkv_window=0), "snapkv_window"),
    ("snapkv even pool", dict(eviction_policy="snapkv", snapkv_pool=4), "snapkv_pool"),
    ("snapkv pool 0", dict(eviction_policy="snapkv", snapkv_pool=0), "snapkv_pool"),
    ("repetition penalty 0", dict(repetition_penalty=0.0), "repetition_penalty"),
    ("presence penalty 3", dict(presence_penalty=3.0), "presence_penalty"),
    ("nan frequency penalty", dict(frequency_penalty=math.nan), "frequency_penalty"),
    ("min_p > 1", dict(min_p=1.5), "min_p"),
    ("min_tokens > max", dict(max_new_tokens=4, min_tokens=5), "min_tokens"),
    ("bias id out of vocab", dict(logit_bias={300: 1.0}), "logit_bias"),
    ("bias 101", dict(logit_bias={65: 101.0}), "logit_bias"),
    ("top_logprobs 21", dict(logprobs=True, top_logprobs=21), "top_logprobs"),
    ("allowed id out of vocab", dict(allowed_token_ids=[65, 259]), "allowed_token_ids"),
    ("negative allowed id", dict(allowed_token_ids=[-1]), "allowed_token_ids"),
    ("empty bad word", dict(bad_words=["  "]), "bad_words"),
    ("65 bad words", dict(bad_words=["w%d" % i for i in range(65)]), "bad_words"),
    ("prompt_top_logprobs 21", dict(prompt_logprobs=True, prompt_top_logprobs=21),
     "prompt_top_logprobs"),
]


@pytest.mark.parametrize("case,fields,field", BAD, ids=[b[0] for b in BAD])
@pytest.mark.parametrize("streaming", [False, True], ids=["unary", "stream"])
def test_bad_field_is_invalid_argument(server, case, fields, field, streaming):
    fields = dict(fields)
    prompt = fields.pop("prompt", "Hello")
    with pytest.raises(grpc.RpcError) as e:
        if streaming:
            list(server.client.stream(prompt, **fields))
        else:
            server.client.generate(prompt, **fields)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, case
    assert e.value.details().startswith(field + ":"), e.value.details()
    assert len(e.value.details()) < 200  # long values are not echoed whole
    assert server.client.generate("still serving", max_new_tokens=2).usage.generated_tokens == 2


UNDECODABLE = [
    ("bad UTF-8 text", b"\x0a\x02\xff\xfe"),
    ("truncated", b"\x0a\x10abc"),
    ("overlong varint", b"\x18" + b"\xff" * 11),  # max_new_tokens
]


@pytest.mark.parametrize("case,data", UNDECODABLE, ids=[u[0] for u in UNDECODABLE])
@pytest.mark.parametrize("method", ["Generate", "GenerateStream", "Tokenize"])
def test_undecodable_request_is_invalid_argument_and_counted(server, case, data, method):
    key = 'fpa_requests_total{code="INVALID_ARGUMENT"}'
    before = server.metrics().get(key, 0)
    path = f"/fpa.v1.FpaService/{method}"
    with pytest.raises(grpc.RpcError) as e:
        if method == "GenerateStream":
            list(server.client.channel.unary_stream(path)(data, timeout=10))
        else:
            server.client.channel.unary_unary(path)(data, timeout=10)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, case
    assert e.value.details().startswith("request:"), e.value.details()
    counted = 0 if method == "Tokenize" else 1  # fpa_requests_total counts generations
    assert server.metrics().get(key, 0) == before + counted


def _send_raw(port: int, data: bytes):
    """Sends bytes and reads until the server closes; a server hanging up early is fine."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        try:
            s.sendall(data)
            s.shutdown(socket.SHUT_WR)
            while s.recv(4096):
                pass
        except OSError:
            pass


def test_garbage_bytes_on_the_ports(server):
    garbage = [os.urandom(4096), b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
               b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + os.urandom(512), b"\x00" * 100000]
    for data in garbage:
        _send_raw(server.port, data)
        _send_raw(server.metrics_port, data)
    assert server.client.health() == "SERVING"
    assert server.client.generate("still serving", max_new_tokens=3).usage.generated_tokens == 3
    assert "fpa_cache_pages" in server.metrics()
