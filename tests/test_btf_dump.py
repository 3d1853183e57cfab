"""bpf.btf_dump: bytes shown as BTF types. Exact text on a small blob built here; every struct and union of this
kernel's BTF decoded from zeros and from random bytes; values put at the offsets bpftool reports read back."""

from __future__ import annotations

import random
import struct

import pytest
from test_btf import bpftool_raw, needs_bpftool, needs_vmlinux, sample

from bpf.btf import BTF
from bpf.btf_dump import decode, dump_type_data

DUMP_MAX = 4096     # what fcap --dump carries of one value: the round trip covers these bytes of every type


@pytest.fixture(scope="module")
def small():
    e, ids = sample()
    return e.load(name="small"), ids


def _skb_bytes() -> bytes:
    d = bytearray(48)
    struct.pack_into("<I", d, 0, 100)                        # len
    d[8] = 0b1101                                           # cloned=1, nohdr=0, fclone=3 (bits 64, 65, 66-67)
    struct.pack_into("<HH", d, 12, 14, 34)                   # the anonymous struct in the anonymous union
    d[16:18] = b"\x08\x00"                                   # protocol, __be16 in network order
    d[18:20] = b"lo"
    struct.pack_into("<Q", d, 40, 0xFFFF888812345678)        # head
    return bytes(d)


def test_multi_line_text(small):
    btf, ids = small
    assert dump_type_data(btf.type(ids["sk_buff"]), _skb_bytes()) == """(struct sk_buff){
\t.len = (unsigned int)100,
\t.cloned = (unsigned char)1,
\t.fclone = (unsigned char)3,
\t(union){
\t\t(struct){
\t\t\t.mac_header = (__u16)14,
\t\t\t.network_header = (__u16)34,
\t\t},
\t\t.headers = (unsigned int)2228238,
\t},
\t.protocol = (__be16)2048,
\t.name = (char[16])"lo",
\t.head = (const char *)0xffff888812345678,
}"""


def test_compact_and_zeroes(small):
    btf, ids = small
    t = btf.type(ids["sk_buff"])
    compact = dump_type_data(t, _skb_bytes(), compact=True)
    assert compact.startswith("(struct sk_buff){.len = (unsigned int)100,.cloned = (unsigned char)1,")
    assert "\n" not in compact and "\t" not in compact
    assert compact.endswith(".head = (const char *)0xffff888812345678,}")
    full = dump_type_data(t, _skb_bytes(), zeroes=True)
    assert "\t.data_len = (unsigned int)0,\n" in full and "\t.nohdr = (unsigned char)0,\n" in full
    assert dump_type_data(t, bytes(48)) == "(struct sk_buff){}"


def test_python_values_and_lookup(small):
    btf, ids = small
    n = decode(btf.type(ids["sk_buff"]), _skb_bytes())
    v = n.python()
    assert v["len"] == 100 and v["fclone"] == 3 and v["nohdr"] == 0 and v["name"] == "lo"
    assert v["mac_header"] == 14 and v["headers"] == 34 << 16 | 14      # anonymous members merged in
    assert v["protocol"] == 0x0800                                     # __be16: the number it stands for
    assert n["network_header"].value == 34 and n["head"].text == "0xffff888812345678"
    with pytest.raises(KeyError):
        n["nope"]


def test_enums_signed_bitfields_floats_pointers(small):
    btf, ids = small
    color, big, ubig = btf.type(ids["color"]), btf.type(ids["big"]), btf.type(ids["ubig"])
    assert dump_type_data(color, struct.pack("<i", 1)) == "(enum color)GREEN"
    assert dump_type_data(color, struct.pack("<i", -1)) == "(enum color)NEG"
    assert dump_type_data(color, struct.pack("<i", 7)) == "(enum color)7"
    assert dump_type_data(big, struct.pack("<q", -2)) == "(enum big)MINUS"
    assert dump_type_data(ubig, b"\xff" * 8) == "(enum ubig)TOP"
    assert dump_type_data(btf.type(ids["int"]), struct.pack("<i", -5)) == "(int)-5"
    assert dump_type_data(btf.type(ids["double"]), struct.pack("<d", 1.5)) == "(double)1.5"
    assert dump_type_data(btf.type(ids["void_ptr"]), bytes(8), zeroes=True) == "(void *)NULL"
    assert dump_type_data(btf.type(ids["fn"]), struct.pack("<Q", 0x1234)) == "(int (*)(int))0x1234"
    # a signed bitfield is sign-extended: 3 bits of 0b110 at bit 5
    assert decode(btf.type(ids["int"]), bytes([0b110 << 5]) + bytes(3), 5, 3).value == -2


def test_truncated_data_is_said(small):
    btf, ids = small
    text = dump_type_data(btf.type(ids["sk_buff"]), _skb_bytes()[:10])
    assert text.startswith("(struct sk_buff){\n\t.len = (unsigned int)100,") and ".protocol" not in text
    assert text.endswith("} /* 10 of 48 bytes */")


@needs_vmlinux
def test_every_vmlinux_struct_and_union_decodes_zeros_and_random_bytes():
    """Each struct and union of this kernel, from zeros and from (seeded) random bytes, as many as fcap --dump
    carries: no exception, and the text names the type."""
    btf, rnd, n = BTF.vmlinux(), random.Random(20240610), 0
    for kind in ("struct", "union"):
        for t in btf.types(kind):
            size = min(t.size, DUMP_MAX)
            zero = dump_type_data(t, bytes(size))
            assert zero.startswith(f"({kind} {t.name}){{" if t.name else f"({kind}){{"), zero
            dump_type_data(t, rnd.randbytes(size), compact=True)
            n += 1
    assert n > 1000


# ---- values at bpftool's offsets -------------------------------------------------------------------------------

def _scalar_members(raw: dict, struct_id: int, base: int = 0, prefix: str = ""):
    """(name, bit offset, bitfield size, base kind, byte size, signed) of every named INT/ENUM/PTR member,
    through anonymous members and typedefs, from bpftool's raw dump."""
    for name, attrs in raw[struct_id][3]:
        tid, bits = int(attrs["type_id"]), base + int(attrs["bits_offset"])
        size_bits = int(attrs.get("bitfield_size", 0))
        while raw[tid][0] in ("TYPEDEF", "CONST", "VOLATILE"):
            tid = int(raw[tid][2]["type_id"])
        kind, _tname, a, _ = raw[tid]
        if name == "(anon)" and kind in ("STRUCT", "UNION"):
            yield from _scalar_members(raw, tid, bits)
        elif name != "(anon)" and kind in ("INT", "ENUM", "PTR"):
            size = 8 if kind == "PTR" else int(a["size"])
            yield name, bits, size_bits, kind, size, a.get("encoding") == "SIGNED"


@needs_vmlinux
@needs_bpftool
@pytest.mark.parametrize("name", ["sock_common", "sk_buff", "net_device", "iphdr", "tcphdr"])
def test_member_values_at_bpftool_offsets(name):
    """A distinct value written at each scalar member's offset (bitfields too) as bpftool reports it reads back
    as that member (__be fields byte-swapped), one member at a time (so that unions cannot hide anything)."""
    raw, btf = bpftool_raw(), BTF.vmlinux()
    sid = next(i for i, (k, n, _, _) in raw.items() if k == "STRUCT" and n == name)
    t, rnd, checked = btf.type(sid), random.Random(name), 0
    for mname, bits, width, kind, size, _signed in _scalar_members(raw, sid):
        if bits + (width or 8 * size) > 8 * DUMP_MAX:
            continue
        nbits = width or 8 * size
        want = rnd.randrange(1, 1 << min(nbits, 63))
        data = bytearray(min(t.size, DUMP_MAX))
        word = int.from_bytes(data[bits // 8:bits // 8 + 9], "little") | want << (bits % 8)
        data[bits // 8:bits // 8 + 9] = word.to_bytes(9, "little")[:len(data) - bits // 8]
        node = decode(t, bytes(data))[mname]
        got = node.value
        if isinstance(got, str):    # an enumerator's name
            got = t.member(mname)[0].type.strip().values[got]
        if node.ctype.startswith("__be") and not width:
            got = int.from_bytes(got.to_bytes(size, "big"), "little")
        if isinstance(got, bool):   # _Bool: any non-zero byte is true
            assert got, (name, mname)
        else:
            assert (got & (1 << nbits) - 1) == want, (name, mname, bits, width, got, want)
        checked += 1
    assert checked >= 5

