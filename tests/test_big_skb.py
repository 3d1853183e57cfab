"""GSO skbs larger than 64 KiB: an 8 MB TCP bulk transfer on lo, captured at tp_btf/net_dev_queue (before
validate_xmit_skb splits anything), keeps every byte of each skb up to the snap length where the records go to the
file rings; where they go through the perf buffer (kernels without skb dynptrs in tracing programs) each keeps the
largest prefix a perf sample holds and its true length. Checked against the sender's data by sequence number."""

from __future__ import annotations

import random
import time

import pytest
from conftest import need_root

from netns import SLOW, read_packets, start_fcap, tcp_bulk

POINT = "tp_btf/net_dev_queue"
NBYTES = 8_000_000
BUFFER_KIB = 4 * NBYTES // 1024
SETTLE = 0.3 * SLOW


def _file_rings() -> bool:
    need_root()
    from fcap.points import pointcaps
    from fcap.live.session import Config, Session
    s = Session(Config(points=[POINT]))
    s.resolve()
    return bool(pointcaps.dynptr_kfunc(s.points[0]))


def _transfer(tmp_path, snaplen: int | None, fmt: str = "pcap", extra: tuple = ()) -> tuple[list, bytes, int]:
    """(the data direction's packets, the data sent, the server's port)."""
    seed = random.randrange(1 << 30)
    path = tmp_path / f"big{snaplen or ''}.{fmt}"
    # (-B: a 4 MB burst at loopback speed would overrun the default rings before the reader wakes up)
    args = ["-i", POINT, "-w", str(path), "-B", str(BUFFER_KIB), *extra] + \
        (["-s", str(snaplen)] if snaplen else []) + ["tcp and host 127.0.0.1"]
    fc = start_fcap(args)
    try:
        sport, _cport = tcp_bulk("127.0.0.1", NBYTES, seed=seed)
        time.sleep(SETTLE)
    finally:
        assert fc.stop() == 0, fc.stderr
    assert "\n0 packets dropped by kernel" in fc.stderr, fc.stderr
    data = random.Random(seed).randbytes(NBYTES)
    pkts = [p for p in read_packets(path) if _ports(p)[1] == sport]
    return pkts, data, sport


def _ports(p) -> tuple[int, int]:
    b = p.l3
    ihl = (b[0] & 15) * 4
    return int.from_bytes(b[ihl:ihl + 2], "big"), int.from_bytes(b[ihl + 2:ihl + 4], "big")


def _segment(p) -> tuple[int, int, int, bytes]:
    """(seq, flags, payload length on the wire, payload bytes as captured)."""
    b = p.l3
    ihl = (b[0] & 15) * 4
    thl = (b[ihl + 12] >> 4) * 4
    seq = int.from_bytes(b[ihl + 4:ihl + 8], "big")
    return seq, b[ihl + 13], p.orig_l3_len - ihl - thl, b[ihl + thl:]


def _check(pkts: list, data: bytes, keep: int) -> tuple[int, int]:
    """Every data segment's captured payload equals the sender's bytes at its sequence number and is as long as
    `keep` allows (keep(orig_l3_len) = bytes of l3 a record must hold); the segments cover all the data. Returns
    (segments, segments over 64 KiB)."""
    syn = [p for p in pkts if _segment(p)[1] & 2]
    assert syn, "no SYN captured"
    isn = _segment(syn[0])[0]
    covered, big = [], 0
    for p in pkts:
        seq, _flags, n, got = _segment(p)
        if n <= 0:
            continue
        assert len(p.l3) == min(p.orig_l3_len, keep(p.orig_l3_len)), \
            f"segment at {seq}: {len(p.l3)} of {p.orig_l3_len} bytes captured"
        rel = (seq - isn - 1) & 0xFFFFFFFF
        assert got == data[rel:rel + len(got)], f"segment at relative seq {rel}: bytes differ from the sender's"
        covered.append((rel, rel + n))
        big += p.orig_l3_len + 14 > 65536
    covered.sort()
    end = 0
    for a, b in covered:
        assert a <= end, f"no segment carries bytes {end}..{a}"
        end = max(end, b)
    assert end == len(data), f"the segments cover {end} bytes, not {len(data)}"
    return len(covered), big


@pytest.mark.parametrize("fmt", ["pcap", "pcapng"])
@pytest.mark.parametrize("dynptr", [True, False], ids=["", "no-skb-dynptr"])
def test_gso_skbs_over_64k_land_whole(tmp_path, fmt, dynptr):
    """The default snap length (262144): each skb whole (file rings with skb dynptrs) or its ~64 KiB prefix (the
    perf buffer: without skb dynptrs, the packets with bytes in frags go there, the linear ones, here the ACKs, to
    the file rings)."""
    rings = _file_rings() and dynptr
    pkts, data, _port = _transfer(tmp_path, None, fmt, () if dynptr else ("--no-skb-dynptr",))
    if rings:
        n, big = _check(pkts, data, lambda orig: orig)
    else:
        from fcap.kernel.layout import COPY_MAX   # what a perf sample holds of the skb (the Ethernet header included)
        n, big = _check(pkts, data, lambda orig: min(orig, COPY_MAX - 14))
    if not big:
        pytest.skip(f"this kernel built no TCP skb over 64 KiB on lo ({n} segments): nothing to check past 64 KiB")
    print(f"{n} segments, {big} over 64 KiB, {'whole (file rings)' if rings else 'perf prefix'}")


def test_snap_length_cuts_big_skbs(tmp_path):
    """-s 70000: an skb longer than that keeps exactly its first 70000 bytes (Ethernet header included)."""
    if not _file_rings():
        pytest.skip("this kernel has no skb dynptr in tracing programs: records go through the perf buffer, whose "
                    "64 KiB limit is below this snap length")
    pkts, data, _port = _transfer(tmp_path, 70000)
    n, big = _check(pkts, data, lambda orig: min(orig, 70000 - 14))
    if not any(p.orig_l3_len + 14 > 70000 for p in pkts):
        pytest.skip(f"this kernel built no TCP skb over 70000 bytes on lo ({n} segments)")
