"""The record's fields, each declared once (fcap.kernel.record): META laid out from them and checked where it is
computed, the parser, the comment and fcap.Packet made from them. Pure (no kernel): the programs that write these
bytes are held to the same comment by tests/test_file_ring.py (the file rings' comment, the program's, against the
perf buffer path's, user space's) and to the kernel's own values by tests/test_api.py."""

from __future__ import annotations

import struct
from dataclasses import fields

import pytest

from fcap.errors import ProgramError
from fcap.kernel import layout, record
from fcap.kernel.record import FIELDS, FILE_HEADER, Attr, Field
from fcap.packet import Packet


def _names(pairs) -> list:
    return [name for name, _fmt in pairs if name]


def test_meta_is_laid_out_from_the_fields():
    meta = layout.META
    assert _names(layout.meta_fields()) == [f.name for f in FIELDS + FILE_HEADER]
    for f in FIELDS + FILE_HEADER:
        width = struct.calcsize("<" + f.fmt)
        assert meta.width(f.name) == width and meta.off(f.name) % min(8, width & -width) == 0, f.name
    assert layout.META_SIZE % 8 == 0
    assert (layout.PCAP_HDR, layout.EPB_HDR) == (16, 28) and meta.end("orig") == layout.META_SIZE


def test_a_new_field_is_placed_aligned():
    """A byte put in before a u32 gets its padding; a u64 after a u16 is moved to its 8-byte boundary; fast stays on
    a word (the drains hash the bytes from skb to it as u64s); the whole stays a multiple of 8 with the file header
    last."""
    at = [f.name for f in FIELDS].index("mark")
    for new in (Field("x", "B", "a byte"), Field("x", "Q", "a word"), Field("x", "H", "a half")):
        pairs = layout.meta_fields(FIELDS[:at] + (new,) + FIELDS[at:])
        meta = layout.Layout("Meta", pairs)
        assert _names(pairs)[at] == "x" and meta.size % 8 == 0
        for f in FIELDS + (new,):
            width = struct.calcsize("<" + f.fmt)
            assert meta.off(f.name) % min(8, width & -width) == 0, (new, f.name)
        assert meta.size - meta.off("ts1") == 16 and meta.size - meta.off("btype") == 28
        assert (meta.off("fast") - meta.off("skb")) % 8 == 0   # (the drains' key: whole u64s)


@pytest.mark.parametrize("where", ["before ts", "after fast", "before skb"])
def test_a_field_outside_skb_to_fast_is_refused(where):
    """The drains cache a block's options by the bytes from skb to fast: a field elsewhere is refused when the
    layout is made, not found when a stale comment is written."""
    new = Field("x", "I", "a word", (Attr("x", key=" x=", style="dec"),))
    names = [f.name for f in FIELDS]
    at = {"before ts": 0, "after fast": len(FIELDS), "before skb": names.index("skb")}[where]
    with pytest.raises(ProgramError, match="ts, id and skb come first, fast last"):
        layout.meta_fields(FIELDS[:at] + (new,) + FIELDS[at:])


def test_the_parser_reads_each_attribute_as_declared():
    """parse_record, made from the declarations: pid and tid from one u64, comm up to its NUL, the protocol in host
    order, a BPF program's return value signed, the queue only under its flag, the bytes after the header."""
    meta = layout.META
    values = {name: 0 for name in meta.Tuple._fields}
    values.update(ts=5, id=6, skb=0xFFFF888100000001, pidtgid=(77 << 32) | 78, comm=b"sh\0junk", len=9, proto=0x0008,
                  verdict=0xFFFFFFFF, queue=3, flags=layout.FLAG_QUEUE, point=2, orig=9, fast=4, mark=0x1F3)
    raw = meta.struct.pack(*(values[n] for n in meta.Tuple._fields)) + b"abcd"
    rec = layout.parse_record(raw)
    assert (rec.ts_ns, rec.id, rec.skb, rec.pid, rec.tid, rec.comm, rec.len, rec.protocol, rec.retval, rec.queue,
            rec.point, rec.orig_len, rec.mark, rec.data) == \
        (5, 6, 0xFFFF888100000001, 77, 78, "sh", 9, 0x0800, -1, 3, 2, 9, 0x1F3, b"abcd")
    values.update(flags=0)
    assert layout.parse_record(meta.struct.pack(*(values[n] for n in meta.Tuple._fields)) + b"abcd").queue is None
    every = {a.name for f in FIELDS + FILE_HEADER for a in f.attrs}
    assert every | {"data", "dumps", "stack"} == set(layout.Record._fields)


def test_the_comment_and_packet_follow_the_fields():
    """The comment shows each keyed attribute in META's order, the length last; its widest middle fits the bytes the
    program keeps for it; fcap.Packet has each attribute declared for it, None until a record gives it (a Record
    attribute not declared for it may share a name with one user space gives: reason, its name in Packet)."""
    keyed = [(a.key, a.name, a.style) for f in FIELDS for a in f.attrs if a.key]
    assert layout.COMMENT == tuple(k for k in keyed if k[1] != "len") + tuple(k for k in keyed if k[1] == "len")
    widest = {"dec": 0xFFFFFFFF, "hex": 0xFFFFFFFF, "hex4": 0xFFFF, "hex16": (1 << 64) - 1, "str": "x" * 16}
    rec = layout.Record._make([widest.get(style, 0) for style in
                               [dict((a, s) for _p, a, s in layout.COMMENT).get(n, "") for n in layout.Record._fields]])
    rec = rec._replace(pkt_type=255)
    text = layout.format_comment(rec)
    middle = text[len("skb=0x") + 16:text.rindex(" len=")]
    assert len(middle) <= layout.MID_MAX and len(text) <= layout.TEXT_MAX
    packet = {f.name: f.default for f in fields(Packet)}
    declared = [a.name for f in FIELDS for a in f.attrs if a.packet]
    assert declared and all(packet.get(name, 0) is None for name in declared), declared
    assert set(record.READS) >= {a.read for f in FIELDS + FILE_HEADER for a in f.attrs}
