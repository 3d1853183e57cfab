"""The captures in pcaps/ (made by fcap itself) read back the same by fcap's reader and by tcpdump."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from fcap.files.pcapread import read

PCAPS = Path(__file__).resolve().parent.parent / "pcaps"


def _udp_payloads(records) -> list[bytes]:
    import dpkt
    out = []
    for r in records:
        if r.linktype == 1:
            ip = dpkt.ethernet.Ethernet(r.data).data
        elif r.linktype == 101:
            ip = dpkt.ip.IP(r.data) if r.data[0] >> 4 == 4 else dpkt.ip6.IP6(r.data)
        else:  # LINUX_SLL2: 20-byte header, then the network header
            ip = dpkt.ip.IP(r.data[20:]) if r.data[20] >> 4 == 4 else dpkt.ip6.IP6(r.data[20:])
        out.append(bytes(ip.data.data))
    return out


SAMPLES = [b"fcap sample 0", b"fcap sample 1", b"fcap sample 2"]


def test_lo_udp_pcapng():
    recs = list(read(PCAPS / "lo-udp.pcapng"))
    assert {r.linktype for r in recs} == {1}
    assert {r.iface_name for r in recs} == {"tp_btf/net_dev_queue"}
    assert _udp_payloads(recs) == SAMPLES + [b"fcap v6"]
    assert all(r.comment and "skb=0x" in r.comment and "comm=python3" in r.comment for r in recs)
    assert all(r.flags is not None and r.flags & 3 == 2 for r in recs)      # outbound


def test_lo_udp_raw_pcap():
    data = (PCAPS / "lo-udp-raw.pcap").read_bytes()
    assert data[:4] == b"\x4d\x3c\xb2\xa1"                                   # nanosecond pcap, little-endian
    recs = list(read(PCAPS / "lo-udp-raw.pcap"))
    assert {r.linktype for r in recs} == {101}
    assert _udp_payloads(recs) == SAMPLES + [b"fcap v6"]


def test_two_points_share_packet_ids():
    recs = list(read(PCAPS / "lo-two-points.pcapng"))
    assert {r.iface_name for r in recs} == {"tp_btf/net_dev_queue", "tp_btf/netif_receive_skb"}
    assert {r.linktype for r in recs} == {276}
    by_id: dict[int, set] = {}
    for r in recs:
        by_id.setdefault(r.packet_id, set()).add(r.iface_name)
    assert len(by_id) == 3 and all(len(v) == 2 for v in by_id.values())
    assert sorted(_udp_payloads(recs)) == sorted(SAMPLES * 2)


@pytest.mark.parametrize("name", ["lo-udp.pcapng", "lo-udp-raw.pcap", "lo-two-points.pcapng"])
def test_tcpdump_reads_them(name):
    if shutil.which("tcpdump") is None:
        pytest.skip("tcpdump is not installed")
    p = subprocess.run(["tcpdump", "-nn", "-r", str(PCAPS / name)], capture_output=True, text=True, timeout=30)
    assert p.returncode == 0, p.stderr
    assert len(p.stdout.splitlines()) == len(list(read(PCAPS / name)))
    assert "UDP, length 13" in p.stdout
