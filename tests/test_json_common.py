"""fcap.text.dissect.common.ether_layers and ether_json against the printers' layers (--json's headers): every
Ethernet packet of tcpdump's test captures and of bench.printing's mixed file, whole, cut short, and with bytes
changed, gives exactly dissect()'s layers (keys, values, their order) and their JSON text, or None; and --json's
lines through them are those without them."""

from __future__ import annotations

import json
import random

from fcap.files import linktypes
from fcap.text import jsonout
from fcap.text.dissect import dissect
from fcap.text.dissect.common import ether_json, ether_layers
from fcap.packet import Packet
from tests.test_show_common import _frames, _variants

EN10MB = linktypes.EN10MB.number


def _ordered(value):
    """A value with its dicts' key order made visible to ==."""
    if isinstance(value, dict):
        return [(k, _ordered(v)) for k, v in value.items()]
    if isinstance(value, list):
        return [_ordered(v) for v in value]
    return (type(value).__name__, value)


def _more_variants(frame: bytes, rng: random.Random):
    yield from _variants(frame, rng)
    for cut in range(0, min(len(frame), 80) + 1, 3):   # every few bytes of the headers
        yield frame[:cut], len(frame)
    for at in (12, 13, 14, 16, 17, 18, 19, 20, 21, 23, 46, 47, 66, 67):   # the fields the fast path decides by
        if at < len(frame):
            for value in (0, 0x45, 0x60, 0x86, 0xFF, rng.randrange(256)):
                b = bytearray(frame)
                b[at] = value
                yield bytes(b), len(b)


def test_common_layers_are_the_printers():
    rng = random.Random(44)
    checked = fallback = texts = 0
    for frame in _frames():
        for data, orig_len in _more_variants(frame, rng):
            fast, text = ether_layers(data, orig_len), ether_json(data, orig_len)
            if fast is None:
                assert text is None, data.hex()
                fallback += 1
                continue
            slow = dissect(data, EN10MB, orig_len).layers
            assert _ordered(fast) == _ordered(slow), data.hex()
            checked += 1
            if text is not None:
                assert "{" + text + "}" == json.dumps(slow, separators=(",", ":"), ensure_ascii=False), data.hex()
                texts += 1
    assert checked > 5000 and checked > fallback and texts > checked // 4


def test_json_lines_are_the_slow_ones(monkeypatch):
    rng = random.Random(45)
    packets = [Packet(ts_ns=1_780_000_000_000_000_000 + i, point=None, data=data, orig_len=orig_len, linktype=EN10MB)
               for i, frame in enumerate(_frames()[::7]) for data, orig_len in _variants(frame, rng)]
    packets.append(Packet(ts_ns=1, point="tp_btf/kfree_skb", data=packets[0].data, orig_len=packets[0].orig_len,
                          linktype=EN10MB, skb=0xFFFF888812345678, pid=7, comm="x", reason="NO_SOCKET",
                          verdict=(1, 2), stack=("a+0x1",)))
    packets += [Packet(ts_ns=2, point="tc/ingress", data=p.data, orig_len=p.orig_len, linktype=EN10MB, skb=i,
                       ifindex=3, direction="in") for i, p in enumerate(packets[::5])]
    fast = [jsonout.packet_line(p) for p in packets]
    fast_objects = [_ordered(jsonout.packet_object(p)) for p in packets]
    monkeypatch.setattr(jsonout, "ether_layers", lambda data, orig_len: None)
    monkeypatch.setattr(jsonout, "ether_json", lambda data, orig_len: None)
    slow = [jsonout.packet_line(p) for p in packets]
    assert fast == slow
    assert fast_objects == [_ordered(jsonout.packet_object(p)) for p in packets]
    assert slow == [json.dumps(jsonout.packet_object(p), separators=(",", ":"), ensure_ascii=False,
                               default=jsonout._plain) + "\n" for p in packets]   # (json.dumps, as before)
