"""A capture file's packets as arrays, for analysis at C speed (numpy): per packet its timestamp, lengths, link
type and where its bytes lie, with the network and transport headers of the common packets decoded for the whole
batch at once (Ethernet with or without one VLAN tag, Linux cooked, raw IP; IPv4 and IPv6; TCP, UDP and SCTP
ports, TCP flags). Only the walk from one record to the next runs per packet in Python; a file this walk does not
read (pcap with Kuznetzov's or an old version's headers, a big-endian pcapng section, Simple or obsolete Packet
Blocks) is read through fcap.files.pcapread instead, with the same result."""

from __future__ import annotations

import struct
from collections.abc import Iterator

from fcap.defaults import NS, SNAPLEN
from fcap.errors import PcapFormatError
from fcap.files import pcapread
from fcap.files.pcapfile import BT_EPB, BT_IDB, BT_SHB, BYTE_ORDER_MAGIC, OPT_CUSTOM, PCAP_MAGIC_NS, PCAP_MAGIC_US
from fcap.live.fastmerge import items, np

FIELDS = np.dtype([
    ("ts_ns", "<i8"), ("caplen", "<u4"), ("len", "<u4"), ("linktype", "<u2"), ("iface", "<u2"),
    ("at", "<i8"),          # where the packet's bytes start in the batch's data
    ("ethertype", "<u2"),   # the network protocol decoded (0: none)
    ("proto", "u1"),        # IPv4's protocol, IPv6's next header (0 where neither was decoded)
    ("tcp_flags", "u1"),
    ("sport", "<u2"), ("dport", "<u2"),   # TCP, UDP and SCTP (0 elsewhere, and in later IPv4 fragments)
    ("src", "V16"), ("dst", "V16"),       # IPv6, or IPv4 mapped (::ffff:a.b.c.d); zeros where neither
])
BATCH = 65536
_CHUNK = 64 << 20
_PRUNES = 4       # passes of _chain over its candidates before it leaves a chunk to the walk a record at a time
_PAD = 64          # zero bytes after a batch's data: header reads past a short packet stay in bounds
_V4_MAPPED = bytes(10) + b"\xff\xff"
ETH_P_IP, ETH_P_IPV6 = 0x0800, 0x86DD
_VLANS = (0x8100, 0x88A8)
_LINK = {1: "ether", 101: "raw", 228: "raw", 229: "raw", 113: "sll", 276: "sll2"}   # link types decoded


class Batch:
    """Up to BATCH packets of a file: `fields` (a numpy structured array, FIELDS' columns, one row per packet) and
    `data`, the bytes the packets lie in (packet i: data[fields['at'][i]:][:fields['caplen'][i]])."""

    __slots__ = ("fields", "data")

    def __init__(self, fields, data):
        self.fields, self.data = fields, data

    def __len__(self) -> int:
        return len(self.fields)

    def packet(self, i: int) -> bytes:
        """Packet i's captured bytes."""
        at = int(self.fields["at"][i])
        return self.data[at:at + int(self.fields["caplen"][i])].tobytes()


def address(value) -> str:
    """A src/dst value as text: a.b.c.d for IPv4 (mapped), IPv6's form otherwise, "" for none."""
    import ipaddress
    raw = bytes(value)
    if raw == bytes(16):
        return ""
    ip = ipaddress.IPv6Address(raw)
    return str(ip.ipv4_mapped or ip)


def batches(path, size: int = BATCH) -> Iterator[Batch]:
    """The packets of a pcap or pcapng file, `size` at a time. PcapFormatError where the file is damaged (after
    the batches before the damage)."""
    with open(path, "rb") as f:
        head = f.read(24)
        f.seek(0)
        fmt = _format(head)
        if fmt is None:
            yield from _from_records(path, size)
        elif fmt == "pcapng":
            yield from _pcapng(f, size)
        else:
            yield from _pcap(f, size, *fmt)


def _format(head: bytes):
    """"pcapng", (byte order, ns per fraction, link type) for a pcap this module walks, None for the rest."""
    if head[:4] == struct.pack("<I", BT_SHB):
        return "pcapng" if head[8:12] == struct.pack("<I", BYTE_ORDER_MAGIC) else None
    for e in "<>":
        if len(head) < 24:
            return None
        magic, major, minor = struct.unpack_from(e + "IHH", head)
        if magic in (PCAP_MAGIC_US, PCAP_MAGIC_NS) and (major, minor) == (2, 4):
            return e, 1 if magic == PCAP_MAGIC_NS else 1000, struct.unpack_from(e + "I", head, 20)[0] & 0x03FFFFFF
    return None


def _pcap(f, size: int, e: str, scale: int, linktype: int) -> Iterator[Batch]:
    """A chunk of the file at a time: its whole records found (_chain, or _walk where that gives up), handed out
    `size` at a time; the damage where no record of a chunk is whole."""
    maxcap = pcapread._MAX_CAPLEN.get(linktype, SNAPLEN)
    snaplen = struct.unpack_from(e + "I", f.read(20), 16)[0]
    snaplen = snaplen if 0 < snaplen <= maxcap else maxcap   # (a packet longer is cut to it, as libpcap does)
    pos = 24
    number = 0
    while True:
        f.seek(pos)
        buf = f.read(_CHUNK)
        if not buf:
            return
        offs, used = _chain(buf, e, maxcap)
        if offs is None:
            offs, used = _walk(buf, e, maxcap)
        if not len(offs):
            caplen = struct.unpack_from(e + "I", buf, 8)[0] if len(buf) >= 16 else 0
            raise _damage(f"invalid packet capture length {caplen}, bigger than maximum of {maxcap}"
                          if caplen > maxcap else
                          "truncated dump file" if len(buf) < _CHUNK else "a packet larger than a batch's chunk",
                          number + 1, pos)
        for i in range(0, len(offs), size):
            part = offs[i:i + size]
            start, stop = int(part[0]), int(offs[i + size]) if i + size < len(offs) else used
            yield pcap_batch(buf[start:stop], part - start, e, scale, snaplen, linktype)
        number += len(offs)
        pos += used
        if len(buf) < _CHUNK and used == len(buf):
            return


def _chain(buf: bytes, e: str, maxcap: int):
    """The offsets of buf's whole records, from its start (an int64 array), and where the last ends, found at C
    speed: a record starts where its seconds' top byte is the first record's (every such byte a candidate), its
    end is the next record's start, and candidates no other candidate ends at are dropped; the chain is then
    checked whole (the first at 0, each record's end the next one's start, no whole record after the last). (None,
    0) where it is not: the file's seconds change their top byte, or a packet's bytes look like a chain of
    headers."""
    b = np.frombuffer(buf, np.uint8)
    n = len(b)
    top = 3 if e == "<" else 0
    if n < 16:
        return None, 0
    at = np.flatnonzero(b[top:n - 15 + top] == b[top])
    caplen = items(b, 16)[at].view(e + "u4").reshape(-1, 4)[:, 2].astype(np.int64)
    ends = at + 16 + caplen
    whole = (caplen <= maxcap) & (ends <= n)
    at, ends = at[whole], ends[whole]
    for _ in range(_PRUNES):
        if not len(at) or at[0] != 0:
            return None, 0
        if (ends[:-1] == at[1:]).all():
            break
        found = np.searchsorted(at, ends)
        inside = found < len(at)
        pointed = np.zeros(len(at), bool)
        pointed[found[inside][at[found[inside]] == ends[inside]]] = True
        pointed[0] = True
        at, ends = at[pointed], ends[pointed]
    else:
        return None, 0
    used = int(ends[-1])
    if used + 16 <= n:
        nxt = struct.unpack_from(e + "I", buf, used + 8)[0]
        if nxt <= maxcap and used + 16 + nxt <= n:   # (a whole record the candidates missed)
            return None, 0
    return at, used


def _walk(buf: bytes, e: str, maxcap: int):
    """_chain's offsets a record at a time, up to the first that is not whole or whose length is damaged."""
    unpack = struct.Struct(e + "I").unpack_from
    offs, end = [], len(buf)
    o = 0
    while o + 16 <= end:
        caplen = unpack(buf, o + 8)[0]
        if caplen > maxcap or o + 16 + caplen > end:
            break
        offs.append(o)
        o += 16 + caplen
    return np.array(offs, np.int64), o


def pcap_batch(records: bytes, at, e: str = "<", scale: int = 1, snaplen: int = SNAPLEN, linktype: int = 1) -> Batch:
    """The pcap records lying whole in `records` whose headers start at offsets `at` (an int64 array), in byte
    order `e` (< or >), their fractions `scale` ns each (1: nanoseconds, 1000: microseconds), as a Batch."""
    b = np.frombuffer(records + bytes(_PAD), np.uint8)
    fields = np.zeros(len(at), FIELDS)
    fields["ts_ns"] = _u32(b, at, e).astype(np.int64) * NS + _u32(b, at + 4, e).astype(np.int64) * scale
    fields["caplen"], fields["len"] = np.minimum(_u32(b, at + 8, e), snaplen), _u32(b, at + 12, e)
    fields["linktype"], fields["at"] = linktype, at + 16
    decode(fields, b)
    return Batch(fields, b)


def _pcapng(f, size: int) -> Iterator[Batch]:
    """Sections in little-endian byte order, Enhanced Packet Blocks: their offsets walked here, the interfaces read
    as fcap.files.pcapread reads them."""
    walk = _Blocks()
    while True:
        f.seek(walk.pos)
        buf = f.read(_CHUNK)
        if not buf:
            return
        offs, ifs, used = walk.through(buf, size)
        if not used:
            raise _damage("truncated block", walk.number + 1, walk.pos)
        if offs:
            yield _epbs(buf[:used] + bytes(_PAD), np.array(offs, np.int64), np.array(ifs, np.int64), walk.section)
        walk.pos += used


class _Blocks:
    """Where a pcapng walk is: the file position, the block count, the section's interfaces."""

    def __init__(self):
        self.pos = self.number = 0
        self.section = pcapread._Section()

    def through(self, buf: bytes, size: int) -> tuple[list, list, int]:
        """The Enhanced Packet Blocks (offsets, interfaces) among the whole blocks at the start of buf, at most
        `size`, and how many bytes those blocks take."""
        u32 = _U32.unpack_from
        offs, ifs, o, end = [], [], 0, len(buf)
        while o + 12 <= end and len(offs) < size:
            btype, total = u32(buf, o)[0], u32(buf, o + 4)[0]
            if total < 12 or total & 3:
                raise _damage(f"block total length {total} is invalid", self.number + 1, self.pos + o)
            if o + total > end:
                break
            self.number += 1
            if btype == BT_EPB:
                if total < 32 or u32(buf, o + 20)[0] > total - 32:
                    raise _damage("an Enhanced Packet Block's captured length is past its end", self.number,
                                  self.pos + o)
                offs.append(o)
                ifs.append(u32(buf, o + 8)[0])
            elif btype in (BT_IDB, BT_SHB):
                self._section_block(btype, buf[o + 8:o + total - 4])
            o += total
        return offs, ifs, o

    def _section_block(self, btype: int, body: bytes) -> None:
        if btype == BT_IDB:
            pcapread._interface_block(self.section, btype, body)
        elif body[:4] != _U32.pack(BYTE_ORDER_MAGIC):
            raise PcapFormatError("a big-endian section after a little-endian one: not read in batches")
        else:
            self.section = pcapread._Section()


_U32 = struct.Struct("<I")


def _epbs(buf: bytes, at, ifs, section) -> Batch:
    b = np.frombuffer(buf, np.uint8)
    if len(ifs) and int(ifs.max()) >= len(section.ifaces):
        raise PcapFormatError(f"an Enhanced Packet Block names interface {int(ifs.max())}, which is not there")
    fields = np.zeros(len(at), FIELDS)
    ts = (_u32(b, at + 12, "<").astype(np.uint64) << np.uint64(32)) | _u32(b, at + 16, "<").astype(np.uint64)
    for i, iface in enumerate(section.ifaces):
        pick = ifs == i
        if pick.any():   # (a few interfaces: fcap's files have one per point)
            fields["ts_ns"][pick] = _ts_ns(ts[pick], iface)
            fields["linktype"][pick] = iface.linktype
    fields["iface"], fields["caplen"], fields["len"] = ifs, _u32(b, at + 20, "<"), _u32(b, at + 24, "<")
    fields["at"] = at + 28
    decode(fields, b)
    return Batch(fields, b)


def plain_epbs(fields, b) -> int:
    """How many of a pcapng batch's packets (fields and data of _epbs' Batch), from its first, have no custom
    option (fcap's --dump values): the Enhanced Packet Blocks' options walked for all the batch at once, an option
    a step."""
    at = fields["at"].astype(np.int64)
    if not len(at):
        return 0

    def u16(o):
        return b[o].astype(np.int64) | b[o + 1].astype(np.int64) << 8

    block = at - 28
    end = block + (u16(block + 4) | u16(block + 6) << 16) - 4
    pos = at + ((fields["caplen"].astype(np.int64) + 3) & ~3)
    active = pos + 4 <= end
    custom = np.zeros(len(at), bool)
    for _ in range(MOST_OPTIONS):
        if not active.any():
            break
        p = np.where(active, pos, 0)
        code = u16(p)
        custom |= active & np.isin(code, OPT_CUSTOM)
        active &= code != 0
        pos = pos + 4 + ((u16(p + 2) + 3) & ~3)
        active &= pos + 4 <= end
    custom |= active   # (more options than walked: the per-record path reads them)
    return int(np.argmax(custom)) if custom.any() else len(at)


MOST_OPTIONS = 32   # options walked in each block; a packet with more counts as having a custom one


def _ts_ns(ts, iface):
    """An interface's timestamps in ns (pcapread._Iface.ts_ns, for an array)."""
    if iface.shift == 0 and iface.mul <= 1000:
        return (ts.astype(np.int64) * iface.mul) // iface.div + iface.offset_ns
    return np.array([iface.ts_ns(int(t)) for t in ts.tolist()], np.int64)


def _from_records(path, size: int) -> Iterator[Batch]:
    """The files the walks leave: read by fcap.files.pcapread, then made arrays."""
    records = pcapread.read(path)
    while True:
        recs = [r for _i, r in zip(range(size), records)]
        if not recs:
            return
        data = b"".join(r.data for r in recs)
        lengths = np.array([len(r.data) for r in recs], np.int64)
        fields = np.zeros(len(recs), FIELDS)
        fields["ts_ns"] = [r.ts_ns for r in recs]
        fields["caplen"], fields["len"] = lengths, [r.orig_len for r in recs]
        fields["linktype"], fields["iface"] = [r.linktype for r in recs], [r.iface for r in recs]
        fields["at"] = np.cumsum(lengths) - lengths
        b = np.frombuffer(data + bytes(_PAD), np.uint8)
        decode(fields, b)
        yield Batch(fields, b)


def _damage(what: str, number: int, at: int) -> PcapFormatError:
    return PcapFormatError(f"{what} (packet or block {number} at byte {at})")


def _u32(b, at, e: str):
    return items(b, 4)[at].view(e + "u4")


def _be16(b, at):
    return (b[at].astype(np.uint16) << 8) | b[at + 1]


def decode(fields, b) -> None:
    """Fills ethertype, proto, tcp_flags, ports and addresses of `fields` from the packets' bytes in `b` (which
    has _PAD bytes after the last packet)."""
    at, end = fields["at"], fields["at"] + fields["caplen"]
    l3 = np.full(len(at), -1, np.int64)
    et = np.zeros(len(at), np.uint16)
    for linktype, kind in _LINK.items():
        pick = np.flatnonzero(fields["linktype"] == linktype)
        if len(pick):
            _link(kind, b, at[pick], end[pick], l3, et, pick)
    v4 = (et == ETH_P_IP) & (l3 >= 0) & (l3 + 20 <= end)
    v4 &= b[np.where(v4, l3, 0)] >> 4 == 4
    v6 = (et == ETH_P_IPV6) & (l3 >= 0) & (l3 + 40 <= end)
    v6 &= b[np.where(v6, l3, 0)] >> 4 == 6
    fields["ethertype"] = np.where(l3 >= 0, et, 0)
    l4 = np.full(len(at), -1, np.int64)
    _ipv4(fields, b, np.flatnonzero(v4), l3, l4)
    _ipv6(fields, b, np.flatnonzero(v6), l3, l4)
    ports = (l4 >= 0) & np.isin(fields["proto"], (6, 17, 132)) & (l4 + 4 <= end)
    p = np.flatnonzero(ports)
    fields["sport"][p], fields["dport"][p] = _be16(b, l4[p]), _be16(b, l4[p] + 2)
    t = np.flatnonzero(ports & (fields["proto"] == 6) & (l4 + 14 <= end))
    fields["tcp_flags"][t] = b[l4[t] + 13]


def _link(kind: str, b, at, end, l3, et, pick) -> None:
    if kind == "ether":
        ok = at + 14 <= end
        e = np.where(ok, _be16(b, at + 12), 0)
        vlan = ok & np.isin(e, _VLANS) & (at + 18 <= end)
        e = np.where(vlan, _be16(b, at + 16), e)
        l3[pick], et[pick] = np.where(ok, at + 14 + 4 * vlan, -1), e
    elif kind == "raw":
        ok = at < end
        v = b[at] >> 4
        l3[pick] = np.where(ok, at, -1)
        et[pick] = np.where(ok & (v == 4), ETH_P_IP, np.where(ok & (v == 6), ETH_P_IPV6, 0))
    else:
        hdr, proto_at = (16, 14) if kind == "sll" else (20, 0)
        ok = at + hdr <= end
        l3[pick], et[pick] = np.where(ok, at + hdr, -1), np.where(ok, _be16(b, at + proto_at), 0)


def _ipv4(fields, b, i, l3, l4) -> None:
    s = l3[i]
    fields["proto"][i] = b[s + 9]
    first = (_be16(b, s + 6) & 0x1FFF) == 0
    l4[i] = np.where(first, s + (b[s] & 15).astype(np.int64) * 4, -1)
    for name, off in (("src", 12), ("dst", 16)):
        v = np.zeros((len(i), 16), np.uint8)
        v[:, 10:12] = 0xFF
        v[:, 12:] = items(b, 4)[s + off].view(np.uint8).reshape(-1, 4)
        fields[name][i] = v.view("V16").reshape(-1)


def _ipv6(fields, b, i, l3, l4) -> None:
    s = l3[i]
    fields["proto"][i] = b[s + 6]
    l4[i] = s + 40
    fields["src"][i] = items(b, 16)[s + 8]
    fields["dst"][i] = items(b, 16)[s + 24]


__all__ = ["BATCH", "Batch", "FIELDS", "address", "batches", "decode", "pcap_batch"]
