"""The gRPC port's connection limits: a cap, a handshake and an idle timeout, and recovery when
file descriptors run out (gRPC 1.51's own listener stopped accepting for good)."""
import os
import socket
import time

import grpc

from conftest import fpa_client, wait_for

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
EMPTY_SETTINGS = bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])


def own_client(address):
    """A client on a connection of its own (Python shares connections between channels)."""
    channel = grpc.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)])
    return channel, fpa_client.pb_grpc.FpaServiceStub(channel)


def cache_stats(stub, timeout=5):
    return stub.CacheStats(fpa_client.pb.CacheStatsRequest(), timeout=timeout)


def new_connection_call(address, timeout=10.0):
    """CacheStats on a connection of its own: (None or the error code, seconds it took)."""
    channel, stub = own_client(address)
    start = time.time()
    try:
        cache_stats(stub, timeout=timeout)
        return None, time.time() - start
    except grpc.RpcError as e:
        return e.code(), time.time() - start
    finally:
        channel.close()


def served(address) -> bool:
    return new_connection_call(address, timeout=2)[0] is None


def seconds_until_closed(sock, limit=10.0):
    start = time.time()
    sock.settimeout(limit)
    try:
        while sock.recv(4096):
            pass
    except ConnectionResetError:
        pass
    return time.time() - start


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_connections_over_the_cap_fail_fast(make_server):
    s = make_server("--max-connections", "3")  # s.client holds one
    clients = [own_client(s.address) for _ in range(2)]
    for _, stub in clients:
        cache_stats(stub)
    code, seconds = new_connection_call(s.address)
    assert code == grpc.StatusCode.UNAVAILABLE
    assert seconds < 5  # refused at once, not left to time out
    clients.pop()[0].close()
    wait_for(lambda: served(s.address), timeout=10)  # the freed slot counts at the next accept


def test_silent_and_foreign_connections_are_closed(make_server):
    s = make_server("--handshake-timeout-seconds", "0.5", "--idle-timeout-seconds", "1")
    with socket.create_connection(("127.0.0.1", s.port)) as silent:
        assert 0.3 < seconds_until_closed(silent) < 3
    with socket.create_connection(("127.0.0.1", s.port)) as http1:
        http1.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        assert seconds_until_closed(http1) < 1
    with socket.create_connection(("127.0.0.1", s.port)) as idle:
        idle.sendall(PREFACE + EMPTY_SETTINGS)
        assert 0.7 < seconds_until_closed(idle) < 4  # GOAWAY after --idle-timeout-seconds
    assert s.client.health() == "SERVING"


def test_listener_recovers_when_descriptors_run_out(make_server):
    s = make_server("--max-connections", "1000", "--handshake-timeout-seconds", "30",
                    nofile=96)
    held = []
    for _ in range(120):  # more than the process may open
        c = socket.create_connection(("127.0.0.1", s.port))
        c.sendall(PREFACE)
        held.append(c)
    time.sleep(1)
    # Out of descriptors: a new client is turned away at once, and nobody spins.
    cpu = cpu_seconds(s.proc.pid)
    start = time.time()
    code, _ = new_connection_call(s.address)
    assert code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
    time.sleep(max(0.0, 2 - (time.time() - start)))
    assert cpu_seconds(s.proc.pid) - cpu < 0.5 * (time.time() - start)
    for c in held:
        c.close()
    wait_for(lambda: served(s.address), timeout=15)  # the listener recovers
    assert s.client.generate("recovered", max_new_tokens=2).usage.generated_tokens == 2


def test_out_of_descriptors_sheds_the_whole_backlog(make_server):
    """Silent clients fill the descriptors and queue in the backlog: a new client is refused
    within a back-off period (the listener used to shed one queued client per period, so a new
    one waited behind all of them)."""
    s = make_server("--max-connections", "1000", "--handshake-timeout-seconds", "60",
                    nofile=96)
    held = [socket.create_connection(("127.0.0.1", s.port)) for _ in range(150)]
    time.sleep(1)
    with socket.create_connection(("127.0.0.1", s.port)) as late:
        assert seconds_until_closed(late, limit=10) < 2.5
    for c in held:
        c.close()
    wait_for(lambda: served(s.address), timeout=15)
