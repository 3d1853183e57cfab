"""The filter reading packet bytes in place through skb->head (where the verifier allows direct loads there): loads
in the first 512 bytes and past them (the slow path, which makes its own skb dynptr), on linear datagrams of many
sizes; at a device point with EN10MB (nothing made up before the bytes: read in place) and with LINUX_SLL2 (20
made-up bytes: read over the copy, as before). Both must keep exactly the datagrams libpcap's expression means."""

from __future__ import annotations

import time

import pytest
from conftest import need_root

from netns import SLOW, UDPSink, l4_payload, read_packets, send_udp, start_fcap

POINT = "tp_btf/net_dev_queue"
SIZES = (1, 64, 101, 400, 600, 2008, 2009, 3000, 9000)
NEAR, FAR = 100, 2000      # payload offsets the filter compares: in the first 512 bytes, and past them


def _payload(size: int, k: int) -> bytes:
    return bytes((i * 7 + k) & 0xFF for i in range(size))


def _byte(off: int, k: int) -> int:
    return (off * 7 + k) & 0xFF


def _slow_path_available() -> bool:
    need_root()
    from fcap.points import pointcaps
    from fcap.live.session import Config, Session
    s = Session(Config(points=[POINT]))
    s.resolve()
    return bool(pointcaps.dynptr_kfunc(s.points[0]))


@pytest.mark.parametrize("linktype", ["EN10MB", "LINUX_SLL2"])
def test_near_and_far_loads_keep_what_the_expression_means(tmp_path, linktype):
    if not _slow_path_available():
        pytest.skip("this kernel has no skb dynptr in tracing programs: loads past the copied bytes reject")
    path = tmp_path / f"inplace-{linktype}.pcap"
    with UDPSink() as sink:
        expr = (f"udp dst port {sink.port} and udp[{8 + NEAR}] = {_byte(NEAR, 1)} "
                f"and udp[{8 + FAR}] = {_byte(FAR, 1)}")
        fc = start_fcap(["-i", POINT, "-y", linktype, "-w", str(path), expr])
        try:
            for k in (1, 2):
                send_udp("127.0.0.1", sink.port, [_payload(n, k) for n in SIZES])
            sink.wait(2 * len(SIZES))
            time.sleep(0.3 * SLOW)
        finally:
            assert fc.stop() == 0, fc.stderr
    got = sorted((len(l4_payload(p)), l4_payload(p)) for p in read_packets(path))
    # kept: k = 1 (byte NEAR matches) and long enough to have byte FAR; the bytes as sent
    want = sorted((n, _payload(n, 1)) for n in SIZES if n > FAR)
    assert [n for n, _ in got] == [n for n, _ in want], f"{linktype}: kept sizes {[n for n, _ in got]}"
    assert got == want
