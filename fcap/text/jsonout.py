"""--json: one JSON object per packet and line, for jq (as pwru and retis emit events). The one encoder of both the
live capture (fcap.live.output.JsonSink) and -r FILE: a fcap.Packet in, a line out. Keys whose value fcap does not
know are left out (never null): a pcap file has no metadata, a non-drop point no reason, a truncated packet no
transport header. The headers are those the printer decodes (fcap.text.dissect, bounds-checked): a damaged or short
packet gives the layers it holds, never an exception."""

from __future__ import annotations

import json
from dataclasses import fields
from operator import itemgetter

from fcap.files import linktypes
from fcap.files.pcapfile import verdict_name
from fcap.text.dissect import dissect
from fcap.text.dissect.common import ether_json, ether_layers
from fcap.packet import Packet

# the Packet attributes written as they are, in its order, when known: all but those written otherwise (a feature's
# new Packet attribute is a JSON key with no more said)
_OTHERWISE = frozenset(("ts_ns", "data", "orig_len", "linktype", "verdict", "dumps", "comment"))
_META = tuple(f.name for f in fields(Packet) if f.name not in _OTHERWISE)
_get_meta, _NONES = itemgetter(*_META), (None,) * len(_META)


def packet_object(p) -> dict:
    """The JSON object of a fcap.Packet (README's "--json" table): time, point, metadata, drop reason, dumps,
    lengths, then the link, network and transport headers."""
    out = _front(p)
    out.update(headers(bytes(p.data), p.linktype, p.orig_len))
    return out


def packet_line(p) -> str:
    """packet_object() as one line of compact JSON, newline-terminated. The common Ethernet frames' headers are
    written as text in one pass (fcap.text.dissect.common.ether_json: the same, tests/test_json_common.py)."""
    data = bytes(p.data)
    if p.linktype == _EN10MB:
        text = ether_json(data, p.orig_len)
        if text is not None:
            d = getattr(p, "__dict__", None)
            if d is not None and type(p.ts_ns) is int and type(p.orig_len) is int and not p.dumps \
                    and p.verdict is None and _meta_nones(d):   # (a file's packet: nothing but the lengths)
                return f'{{"ts_ns":{p.ts_ns},"len":{p.orig_len},"caplen":{len(data)},"linktype":{_EN10MB},{text}}}\n'
            return _ENCODER.encode(_front(p))[:-1] + "," + text + "}\n"
    out = _front(p)
    out.update(headers(data, p.linktype, p.orig_len))
    return _ENCODER.encode(out) + "\n"


def _front(p) -> dict:
    """The object's keys before the headers."""
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
    return out


def _meta_nones(d: dict) -> bool:
    """Whether a Packet's __dict__ has None for every _META attribute."""
    try:
        return _get_meta(d) == _NONES
    except KeyError:
        return False


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

def headers(data: bytes, linktype: int, orig_len: int) -> dict:
    """{"link": ..., "ip": ..., "tcp"|"udp"|"icmp"|"icmp6": ...} or "arp", as far as the bytes go: the layers the
    printer decoded on its way (fcap.text.dissect), so that the line and the JSON never disagree. The common
    Ethernet frames' in one pass (fcap.text.dissect.common.ether_layers: the same, tests/test_json_common.py)."""
    if linktype == _EN10MB:
        layers = ether_layers(data, orig_len)
        if layers is not None:
            return layers
    return dissect(data, linktype, orig_len).layers


_EN10MB = linktypes.EN10MB.number


_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, default=_plain)   # (json.dumps' own, made once)
