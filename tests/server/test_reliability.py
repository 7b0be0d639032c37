"""Every RPC ends with a status that /metrics counts, whatever the client does: stalled and
vanished stream readers, undecodable requests. SIGTERM then exits within --drain-seconds."""
import signal

import grpc

from conftest import LONG, fpa_client, wait_for

pb = fpa_client.pb
pb_grpc = fpa_client.pb_grpc


def requests_total(server) -> float:
    return sum(v for k, v in server.metrics().items() if k.startswith("fpa_requests_total{"))


def stalled_stub(address):
    """A client whose flow-control window stays tiny: a stream it does not read stalls the
    server's writes after a few hundred bytes."""
    channel = grpc.insecure_channel(address, options=[("grpc.http2.bdp_probe", 0),
                                                      ("grpc.http2.lookahead_bytes", 1024)])
    return channel, pb_grpc.FpaServiceStub(channel)


def test_stalled_stream_cancelled_after_generation_is_finished_and_counted(make_server):
    s = make_server("--drain-seconds", "5")
    channel, stub = stalled_stub(s.address)
    before = requests_total(s)
    generated = s.metrics().get("fpa_generated_tokens_total", 0)
    calls = [stub.GenerateStream(fpa_client.make_request(f"stall {i}", max_new_tokens=2048,
                                                         logprobs=True, ignore_eos=True))
             for i in range(4)]
    # Nothing is read: the generations end while their writes wait for the window.
    wait_for(lambda: s.metrics()["fpa_generated_tokens_total"] == generated + 4 * 2048,
             timeout=120)
    wait_for(lambda: s.client.cache_stats().pages_in_use == 0)
    for c in calls:
        c.cancel()
    wait_for(lambda: requests_total(s) == before + len(calls))
    channel.close()
    s.proc.send_signal(signal.SIGTERM)
    assert s.proc.wait(timeout=8) == 0


def test_vanished_reader_is_counted_as_cancelled(make_server):
    s = make_server("--drain-seconds", "5", "--max-new-tokens", str(LONG))
    channel, stub = stalled_stub(s.address)
    key = 'fpa_requests_total{code="CANCELLED"}'
    before = s.metrics().get(key, 0)
    call = stub.GenerateStream(fpa_client.make_request("vanish", max_new_tokens=LONG,
                                                       logprobs=True, ignore_eos=True))
    wait_for(lambda: s.client.cache_stats().requests_running == 1)
    channel.close()  # the connection goes away mid-generation
    wait_for(lambda: s.metrics().get(key, 0) == before + 1)
    wait_for(lambda: s.client.cache_stats().pages_in_use == 0)
    del call
    s.proc.send_signal(signal.SIGTERM)
    assert s.proc.wait(timeout=8) == 0
