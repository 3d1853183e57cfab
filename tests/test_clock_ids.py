"""Where the capture program reads the clock (first when every packet is recorded, after whatever may turn a packet
away otherwise), and one point's packet ids unique and in order per CPU in a real capture with senders on every CPU
(fcap.kernel.program.Builder.clock, fcap.kernel.track._new_id)."""

from __future__ import annotations

import multiprocessing
import os
import socket
import time

import pytest
from conftest import need_root

from netns import UDPSink, read_packets, run_fcap, start_fcap, tcp_bulk

POINT = "tp_btf/net_dev_queue"
ID_CPU_BITS = 12
PROLOGUE_OUTS = 2      # the prologue leaves for "out" without an skb or a scratch value


def _program(args: list[str]) -> list[str]:
    r = run_fcap(["-i", POINT, "-w", "/dev/null", "--format", "pcapng", "--dump-ebpf", *args])
    assert r.returncode == 0, r.stderr.decode()
    return r.stdout.decode().splitlines()


def _outs_before_clock(lines: list[str]) -> int:
    clock = next(i for i, line in enumerate(lines) if "call bpf_ktime_get_ns" in line)
    return sum("goto out" in line for line in lines[:clock])


def test_clock_first_when_nothing_turns_a_packet_away():
    need_root()
    assert _outs_before_clock(_program([])) == PROLOGUE_OUTS


@pytest.mark.parametrize("args", [["udp"], ["--where", "skb->len > 10"], ["--pid", "1"], ["--track"]],
                         ids=["filter", "where", "pid", "track"])
def test_clock_after_what_turns_a_packet_away(args):
    need_root()
    assert _outs_before_clock(_program(args)) > PROLOGUE_OUTS


def _send_from(cpu: int, port: int, n: int) -> None:
    os.sched_setaffinity(0, {cpu})
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for i in range(n):
            s.sendto(b"fcap-ids" + i.to_bytes(4, "big"), ("127.0.0.1", port))


def test_packet_ids_unique_and_in_order_per_cpu(tmp_path):
    need_root()
    cpus = sorted(os.sched_getaffinity(0))
    path = tmp_path / "ids.pcapng"
    p = start_fcap(["-i", POINT, "-s", "96", "-w", str(path)])
    try:
        with UDPSink() as sink:
            ctx = multiprocessing.get_context("fork")
            senders = [ctx.Process(target=_send_from, args=(cpu, sink.port, 3000)) for cpu in cpus]
            for s in senders:
                s.start()
            tcp_bulk("127.0.0.1", 2 << 20)      # ACKs sent from softirqs meanwhile
            for s in senders:
                s.join(60)
                assert s.exitcode == 0
        time.sleep(0.3)
    finally:
        p.stop()
    assert p.p.returncode == 0, p.stderr
    assert "0 packets dropped" in p.stderr, p.stderr
    pkts = read_packets(path)
    assert sum(b"fcap-ids" in k.l3 for k in pkts) == 3000 * len(cpus)
    ids = [k.packet_id for k in pkts]
    assert None not in ids and len(set(ids)) == len(ids)
    by_cpu: dict[int, list] = {}
    for k in sorted(pkts, key=lambda k: k.ts_ns):
        by_cpu.setdefault(k.packet_id & ((1 << ID_CPU_BITS) - 1), []).append(k.packet_id >> ID_CPU_BITS)
    for cpu, seq in by_cpu.items():
        assert seq == sorted(seq), f"CPU {cpu}: ids out of time order"
