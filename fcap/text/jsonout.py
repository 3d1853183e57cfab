"""--json: one JSON object per packet and line, for jq (as pwru and retis emit events). The one encoder of both the
live capture (fcap.live.output.JsonSink) and -r FILE: a fcap.Packet in, a line out. Keys whose value fcap does not
know are left out (never null): a pcap file has no metadata, a non-drop point no reason, a truncated packet no
transport header. The headers are decoded here with struct, bounds-checked: a damaged or short packet gives the
layers it holds, never an exception."""

from __future__ import annotations

import ipaddress
import json
import struct
from dataclasses import fields

from fcap.files import linktypes
from fcap.files.pcapfile import verdict_name
from fcap.text.dissect.link import BSD_AF_INET, BSD_AF_INET6, bsd_family
from fcap.text.packet import Packet

# the Packet attributes written as they are, in its order, when known: all but those written otherwise (a feature's
# new Packet attribute is a JSON key with no more said)
_OTHERWISE = frozenset(("ts_ns", "data", "orig_len", "linktype", "verdict", "dumps", "comment"))
_META = tuple(f.name for f in fields(Packet) if f.name not in _OTHERWISE)
_TCP_FLAGS = ("FIN", "SYN", "RST", "PSH", "ACK", "URG", "ECE", "CWR")
_IP6_EXTENSIONS = frozenset((0, 43, 60))     # hop-by-hop, routing, destination options: skipped to what they carry
_IP6_FRAGMENT = 44
_VLAN = frozenset((0x8100, 0x88A8, 0x9100))
_ETH_IP4, _ETH_IP6, _ETH_ARP = 0x0800, 0x86DD, 0x0806


def packet_object(p) -> dict:
    """The JSON object of a fcap.Packet (README's "--json" table): time, point, metadata, drop reason, dumps,
    lengths, then the link, network and transport headers."""
    out: dict = {"ts_ns": p.ts_ns}
    for name in _META:
        value = getattr(p, name, None)
        if value is not None:
            out[name] = f"0x{value:016x}" if name == "skb" else value   # (an address: jq's doubles would round it)
    if p.verdict is not None and verdict_name(*p.verdict) is not None:
        out["verdict"] = verdict_name(*p.verdict)
    if p.dumps:
        out["dumps"] = {path: _dump_value(d) for path, d in p.dumps.items()}
    out["len"] = p.orig_len
    out["caplen"] = len(p.data)
    out["linktype"] = p.linktype
    out.update(headers(bytes(p.data), p.linktype))
    return out


def packet_line(p) -> str:
    """packet_object() as one line of compact JSON, newline-terminated."""
    return json.dumps(packet_object(p), separators=(",", ":"), ensure_ascii=False, default=_plain) + "\n"


def _plain(value):
    """What json cannot write by itself: bytes (a dump's raw data) as hex."""
    if isinstance(value, (bytes, bytearray)):
        return value.hex()
    raise TypeError(f"{type(value).__name__} is not JSON")


def _dump_value(d):
    """A --dump value typed (numbers, strings, objects, arrays) where its BTF type is known; its text otherwise
    (a file read on a kernel without that type) or {"error": ...} when the kernel had none to give."""
    if d.error is not None:
        return {"error": d.error}
    value = d.value
    return value if value is not None else d.text(compact=True)


# ---- headers -----------------------------------------------------------------------------------------------------

def headers(data: bytes, linktype: int) -> dict:
    """{"link": ..., "ip": ..., "tcp"|"udp"|"icmp"|"icmp6": ...} or "arp", as far as the bytes go."""
    out: dict = {}
    start = _link(data, linktype, out)
    if start is not None:
        _network(data, *start, out)
    return out


def _link(data: bytes, linktype: int, out: dict):
    """The link header into out["link"]; (offset, ethertype) of what it carries, or None (fcap.files.linktypes'
    FRAMING says which header)."""
    framing = linktypes.framing(linktype)
    if framing == "ethernet":
        if len(data) < 14:
            return None
        link = {"dst": _mac(data[0:6]), "src": _mac(data[6:12])}
        off, etype = 14, struct.unpack_from("!H", data, 12)[0]
        vlans = []
        while etype in _VLAN and len(data) >= off + 4:
            tci, etype = struct.unpack_from("!HH", data, off)
            vlans.append(tci & 0xFFF)
            off += 4
        if vlans:
            link["vlan"] = vlans
        link["ethertype"] = etype
        out["link"] = link
        return off, etype
    if framing == "sll2" and len(data) >= 20:
        etype, _mbz, ifindex, _hrd, pkttype, hlen = struct.unpack_from("!HHiHBB", data, 0)
        out["link"] = _cooked(etype, pkttype, data[12:12 + min(hlen, 8)], ifindex=ifindex)
        return 20, etype
    if framing == "sll" and len(data) >= 16:
        pkttype, _hrd, hlen = struct.unpack_from("!HHH", data, 0)
        etype = struct.unpack_from("!H", data, 14)[0]
        out["link"] = _cooked(etype, pkttype, data[6:6 + min(hlen, 8)])
        return 16, etype
    if framing == "raw" and data:   # the version says which
        version = data[0] >> 4
        return 0, _ETH_IP4 if version == 4 else _ETH_IP6 if version == 6 else None
    if framing == "null" and len(data) >= 4:
        family = bsd_family(data, linktype)
        out["link"] = {"family": family}
        return 4, _ETH_IP4 if family == BSD_AF_INET else _ETH_IP6 if family in BSD_AF_INET6 else None
    return None


def _cooked(etype: int, pkttype: int, addr: bytes, **more) -> dict:
    link = {"ethertype": etype, "pkttype": pkttype, **more}
    if len(addr) == 6:
        link["src"] = _mac(addr)
    return link


def _network(data: bytes, off: int, etype, out: dict) -> None:
    if etype == _ETH_IP4:
        _ip4(data, off, out)
    elif etype == _ETH_IP6:
        _ip6(data, off, out)
    elif etype == _ETH_ARP and len(data) >= off + 28:
        op = struct.unpack_from("!H", data, off + 6)[0]
        out["arp"] = {"op": op, "src": str(ipaddress.IPv4Address(data[off + 14:off + 18])),
                      "dst": str(ipaddress.IPv4Address(data[off + 24:off + 28]))}


def _ip4(data: bytes, off: int, out: dict) -> None:
    if len(data) < off + 20 or data[off] >> 4 != 4:
        return
    ihl = (data[off] & 0xF) * 4
    total, frag, ttl, proto = struct.unpack_from("!H2xHBB", data, off + 2)
    out["ip"] = {"version": 4, "src": str(ipaddress.IPv4Address(data[off + 12:off + 16])),
                 "dst": str(ipaddress.IPv4Address(data[off + 16:off + 20])), "proto": proto, "ttl": ttl,
                 "len": total}
    if frag & 0x1FFF == 0 and ihl >= 20:   # (a later fragment carries no transport header)
        _transport(data, off + ihl, proto, out, "icmp")


def _ip6(data: bytes, off: int, out: dict) -> None:
    if len(data) < off + 40 or data[off] >> 4 != 6:
        return
    plen, nh, hlim = struct.unpack_from("!HBB", data, off + 4)
    ip = {"version": 6, "src": str(ipaddress.IPv6Address(data[off + 8:off + 24])),
          "dst": str(ipaddress.IPv6Address(data[off + 24:off + 40])), "ttl": hlim, "len": plen + 40}
    out["ip"] = ip
    off += 40
    first = True
    while nh in _IP6_EXTENSIONS or nh == _IP6_FRAGMENT:
        if len(data) < off + 8:
            ip["proto"] = nh
            return
        if nh == _IP6_FRAGMENT:
            first = first and struct.unpack_from("!H", data, off + 2)[0] & 0xFFF8 == 0
            nh, off = data[off], off + 8
        else:
            nh, off = data[off], off + (data[off + 1] + 1) * 8
    ip["proto"] = nh
    if first:
        _transport(data, off, nh, out, "icmp6")


def _transport(data: bytes, off: int, proto: int, out: dict, icmp: str) -> None:
    if proto == 6 and len(data) >= off + 14:
        sport, dport, seq, ack, flags = struct.unpack_from("!HHIIxB", data, off)
        tcp = {"sport": sport, "dport": dport, "flags": [n for i, n in enumerate(_TCP_FLAGS) if flags >> i & 1],
               "seq": seq, "ack": ack}
        if len(data) >= off + 16:
            tcp["win"] = struct.unpack_from("!H", data, off + 14)[0]
        out["tcp"] = tcp
    elif proto == 17 and len(data) >= off + 4:
        sport, dport = struct.unpack_from("!HH", data, off)
        out["udp"] = {"sport": sport, "dport": dport}
    elif proto == (1 if icmp == "icmp" else 58) and len(data) >= off + 2:
        out[icmp] = {"type": data[off], "code": data[off + 1]}


def _mac(b: bytes) -> str:
    return ":".join(f"{x:02x}" for x in b)
