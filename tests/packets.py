"""Reading the tests' captures back: each packet from its network header on (fcap's own reader), its flow and
payload."""

from __future__ import annotations

import socket
from dataclasses import dataclass, field


@dataclass
class Pkt:
    """A captured packet: the bytes from the network header on, plus what the file said."""

    ts_ns: int
    l3: bytes                 # from the network header on (as captured: may be a prefix)
    orig_l3_len: int          # original length from the network header on
    linktype: int
    raw: bytes = b""
    iface_name: str | None = None
    comment: str | None = None
    flags: int | None = None
    extra: dict = field(default_factory=dict)
    packet_id: int | None = None   # pcapng epb_packetid (fcap: the packet id, fcap.kernel.track)


ETH_HLEN = 14
LINKTYPE_EN10MB, LINKTYPE_RAW, LINKTYPE_LINUX_SLL2 = 1, 101, 276
LINKTYPE_IPV4, LINKTYPE_IPV6 = 228, 229


def read_packets(path) -> list[Pkt]:
    """Every packet of a pcap/pcapng file (fcap's own reader), with the link header taken off."""
    from fcap.files.pcapread import read
    out = []
    for r in read(path):
        off = {LINKTYPE_EN10MB: ETH_HLEN, LINKTYPE_RAW: 0, LINKTYPE_IPV4: 0, LINKTYPE_IPV6: 0,
               LINKTYPE_LINUX_SLL2: 20}.get(r.linktype)
        if off is None:
            raise AssertionError(f"{path}: unexpected linktype {r.linktype}")
        out.append(Pkt(r.ts_ns, bytes(r.data[off:]), r.orig_len - off, r.linktype, bytes(r.data), r.iface_name,
                       r.comment, r.flags, packet_id=r.packet_id))
    return out


def ethertype(p: Pkt) -> int | None:
    if p.linktype == LINKTYPE_EN10MB and len(p.raw) >= 14:
        return int.from_bytes(p.raw[12:14], "big")
    if p.l3[:1] and p.l3[0] >> 4 == 4:
        return 0x0800
    if p.l3[:1] and p.l3[0] >> 4 == 6:
        return 0x86DD
    return None


@dataclass(frozen=True)
class Flow:
    proto: int
    src: str
    dst: str
    sport: int
    dport: int


def flow_of(p: Pkt) -> Flow | None:
    """(protocol, addresses, ports) of an IPv4/IPv6 packet; ICMP id as the ports (0 for other ICMP)."""
    b = p.l3
    et = ethertype(p)
    if et == 0x0800 and len(b) >= 20 and b[0] >> 4 == 4:
        ihl = (b[0] & 15) * 4
        proto = b[9]
        src, dst = socket.inet_ntop(socket.AF_INET, b[12:16]), socket.inet_ntop(socket.AF_INET, b[16:20])
        t = b[ihl:]
    elif et == 0x86DD and len(b) >= 40 and b[0] >> 4 == 6:
        proto = b[6]
        src, dst = socket.inet_ntop(socket.AF_INET6, b[8:24]), socket.inet_ntop(socket.AF_INET6, b[24:40])
        t = b[40:]
    else:
        return None
    if proto in (6, 17) and len(t) >= 4:
        return Flow(proto, src, dst, int.from_bytes(t[0:2], "big"), int.from_bytes(t[2:4], "big"))
    if proto in (1, 58) and len(t) >= 8:
        return Flow(proto, src, dst, t[0], int.from_bytes(t[4:6], "big"))
    return Flow(proto, src, dst, 0, 0)


def l4_payload(p: Pkt) -> bytes:
    """The UDP payload (or whatever follows an 8-byte header) of an IPv4/IPv6 packet."""
    b = p.l3
    if b[0] >> 4 == 4:
        return b[(b[0] & 15) * 4 + 8:]
    return b[48:]


def summary(stderr: str) -> dict[str, int]:
    """The summary lines fcap (and tcpdump) end with, as numbers: {'captured': N, 'received by filter': N,
    'dropped by kernel': N}; each of the three must be there once."""
    out = {}
    for key in ("captured", "received by filter", "dropped by kernel"):
        m = [ln for ln in stderr.splitlines() if ln.endswith(f" {key}") and ln.split()[0].isdigit()]
        assert len(m) == 1, f"no single '{key}' line in the capture's stderr:\n{stderr}"
        out[key] = int(m[0].split()[0])
    return out
