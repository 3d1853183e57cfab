"""A capture file's packets as arrays, for analysis at C speed (numpy): per packet its timestamp, lengths, link
type and where its bytes lie, with the network and transport headers of the common packets decoded for the whole
batch at once (Ethernet with or without one VLAN tag, Linux cooked, raw IP; IPv4 and IPv6; TCP, UDP and SCTP
ports, TCP flags). The records are found at C speed too (runs of records each starting where the one before ends,
_linked), a record at a time in Python only where packet bytes look like a chain of headers or the seconds' top
byte changes. A file this walk does not read (pcap with Kuznetzov's or an old version's headers, a big-endian
pcapng section, Simple or obsolete Packet Blocks) is read through fcap.files.pcapread instead, with the same
result."""

from __future__ import annotations

import struct
from collections.abc import Iterator

from fcap.defaults import FILE_BATCH, NS, SNAPLEN
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
_CHUNK = 2 << 20   # bytes of the file read at a time at least (a batch's records lie in one chunk) ...
_CHUNK_MOST = 64 << 20   # ... and at most: 256 bytes a record of a batch's size between (fcap.batches: 16 MiB)
_PRUNES = 4       # passes of _linked over its candidates (each drops what looked like headers inside packets)
_PAD = 128         # zero bytes after a batch's data: header reads past a short packet stay in bounds (fcap -r reads 96)
_V4_MAPPED = bytes(10) + b"\xff\xff"
ETH_P_IP, ETH_P_IPV6 = 0x0800, 0x86DD
_VLANS = (0x8100, 0x88A8)
_LINK = {1: "ether", 101: "raw", 228: "raw", 229: "raw", 113: "sll", 276: "sll2"}   # link types decoded


class Batch:
    """Packets of a file, up to the size batches() was asked for: `fields` (a numpy structured array, FIELDS'
    columns, one row per packet) and `data`, the bytes the packets lie in (packet i:
    data[fields['at'][i]:][:fields['caplen'][i]])."""

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


def batches(path, size: int = FILE_BATCH, decoded: bool = True) -> Iterator[Batch]:
    """The packets of a pcap or pcapng file, `size` at a time. PcapFormatError where the file is damaged (after
    the batches before the damage). decoded=False: the fields decode() fills are left zero (the printers read the
    headers themselves)."""
    with open(path, "rb") as f:
        head = f.read(24)
        f.seek(0)
        fmt = _format(head)
        found = _from_records(path, size) if fmt is None else _pcapng(f, size) if fmt == "pcapng" else \
            _pcap(f, size, *fmt)
        for batch in found:
            if decoded:
                decode(batch.fields, batch.data)
            yield batch


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
    """A chunk of the file at a time: its whole records found in runs (_chain at C speed, else _walk a record at a
    time), handed out `size` at a time; the damage where no record of a chunk is whole."""
    maxcap = pcapread._MAX_CAPLEN.get(linktype, SNAPLEN)
    snaplen = struct.unpack_from(e + "I", f.read(20), 16)[0]
    snaplen = snaplen if 0 < snaplen <= maxcap else maxcap   # (a packet longer is cut to it, as libpcap does)
    pos = 24
    number = 0
    chunks = _Chunks(f, size)
    while True:
        buf = chunks.at(pos)
        if not buf:
            return
        b, o = np.frombuffer(buf, np.uint8), 0
        while True:
            offs, stop = _chain(b, o, e, maxcap)
            if not len(offs):
                offs, stop = _walk(buf, o, e, maxcap, size)
            if stop == o:
                break
            for i, start, end in _pieces(offs, stop, size):
                yield pcap_batch(memoryview(buf)[start:end], offs[i:i + size] - start, e, scale, snaplen, linktype)
            number += len(offs)
            o = stop
        if not o:
            caplen = struct.unpack_from(e + "I", buf, 8)[0] if len(buf) >= 16 else 0
            raise _damage(f"invalid packet capture length {caplen}, bigger than maximum of {maxcap}"
                          if caplen > maxcap else
                          "truncated dump file" if len(buf) < len(chunks.buf) else
                          "a packet larger than a batch's chunk",
                          number + 1, pos)
        pos += o
        if len(buf) < len(chunks.buf) and o == len(buf):
            return


class _Chunks:
    """A file read a chunk at a time into one buffer (a fresh 64 MiB each time cost its page faults: ~0.1 µs a
    packet), big enough for batches of `size` records of 256 bytes: each chunk is valid until the next; the
    batches copy what they keep."""

    def __init__(self, f, size: int):
        self.f, self.buf = f, bytearray(min(max(_CHUNK, size << 8), _CHUNK_MOST))

    def at(self, pos: int) -> memoryview:
        self.f.seek(pos)
        return memoryview(self.buf)[:self.f.readinto(self.buf)]


def _pieces(offs, stop: int, size: int) -> Iterator[tuple[int, int, int]]:
    """A run's batches of `size` records (offs: where each starts; stop: where the last ends): the first's index,
    and where the batch's bytes start and end."""
    for i in range(0, len(offs), size):
        yield i, int(offs[i]), int(offs[i + size]) if i + size < len(offs) else stop


def _chain(b, start: int, e: str, maxcap: int):
    """The offsets of the whole records that follow one another from `start` in b (an int64 array, empty where the
    record there is not one of them) and where the last ends, found at C speed: a candidate wherever a byte is the
    top byte of the seconds of the record at `start`, each candidate's end from its length, then _linked."""
    n = len(b)
    if start + 16 > n:
        return _NO_OFFSETS, start
    top = 3 if e == "<" else 0
    at = start + np.flatnonzero(b[start + top:n - 15 + top] == b[start + top])
    caplen = items(b, 16)[at].view(e + "u4").reshape(-1, 4)[:, 2].astype(np.int64)
    ends = at + 16 + caplen
    whole = (caplen <= maxcap) & (ends <= n)
    at, ends = _linked(at[whole], ends[whole], start)
    return at, int(ends[-1]) if len(at) else start


def _linked(at, ends, start: int):
    """The run of candidates (sorted starts, and ends) each of which starts where the one before ends, from
    `start`: every one a record, whatever else the candidates hold (packet bytes that look like headers are
    dropped first, a few passes: the candidates no other one ends at). Empty where no candidate starts there."""
    if not len(at) or at[0] != start:
        return _NO_OFFSETS, _NO_OFFSETS
    for _ in range(_PRUNES):
        breaks = np.flatnonzero(ends[:-1] != at[1:])
        if not len(breaks):
            return at, ends
        nxt = ends[breaks[0]]
        i = int(np.searchsorted(at, nxt))
        if i == len(at) or at[i] != nxt:
            break   # (the run's next record is none of the candidates)
        found = np.searchsorted(at, ends)
        inside = found < len(at)
        pointed = np.zeros(len(at), bool)
        pointed[found[inside][at[found[inside]] == ends[inside]]] = True
        pointed[0] = True
        at, ends = at[pointed], ends[pointed]
    breaks = np.flatnonzero(ends[:-1] != at[1:])
    run = int(breaks[0]) + 1 if len(breaks) else len(at)
    return at[:run], ends[:run]


_NO_OFFSETS = np.zeros(0, np.int64)


def _walk(buf: bytes, o: int, e: str, maxcap: int, most: int):
    """_chain's offsets and end a record at a time, up to `most` records or the first that is not whole or whose
    length is damaged."""
    unpack = struct.Struct(e + "I").unpack_from
    offs, end = [], len(buf)
    while o + 16 <= end and len(offs) < most:
        caplen = unpack(buf, o + 8)[0]
        if caplen > maxcap or o + 16 + caplen > end:
            break
        offs.append(o)
        o += 16 + caplen
    return np.array(offs, np.int64), o


def pcap_batch(records: bytes, at, e: str = "<", scale: int = 1, snaplen: int = SNAPLEN, linktype: int = 1) -> Batch:
    """The pcap records lying whole in `records` whose headers start at offsets `at` (an int64 array), in byte
    order `e` (< or >), their fractions `scale` ns each (1: nanoseconds, 1000: microseconds), as a Batch (not
    decoded: decode() fills its 5-tuple)."""
    b = np.frombuffer(b"".join((records, bytes(_PAD))), np.uint8)
    fields = np.zeros(len(at), FIELDS)
    fields["ts_ns"] = _u32(b, at, e).astype(np.int64) * NS + _u32(b, at + 4, e).astype(np.int64) * scale
    fields["caplen"], fields["len"] = np.minimum(_u32(b, at + 8, e), snaplen), _u32(b, at + 12, e)
    fields["linktype"], fields["at"] = linktype, at + 16
    return Batch(fields, b)


def _pcapng(f, size: int) -> Iterator[Batch]:
    """Sections in little-endian byte order, Enhanced Packet Blocks: a chunk of the file at a time, its runs of
    Enhanced Packet Blocks found at C speed (_epb_run), the other blocks walked one at a time, the interfaces read
    as fcap.files.pcapread reads them."""
    walk = _Blocks()
    chunks = _Chunks(f, size)
    while True:
        buf = chunks.at(walk.pos)
        if not buf:
            return
        w = np.frombuffer(buf, "<u4", len(buf) // 4)
        o = 0
        while True:
            offs = _epb_run(w, len(buf), o)
            if len(offs):
                stop = int(offs[-1]) + int(w[offs[-1] // 4 + 1])
                walk.number += len(offs)
                ifs = w[offs // 4 + 2].astype(np.int64)
            else:
                packets = o + 4 <= len(buf) and _U32.unpack_from(buf, o)[0] == BT_EPB
                offs, ifs, stop = walk.through(buf, o, size, packets)
                offs, ifs = np.array(offs, np.int64), np.array(ifs, np.int64)
            if stop == o:
                break
            for i, start, end in _pieces(offs, stop, size):
                yield _epbs(b"".join((memoryview(buf)[start:end], bytes(_PAD))), offs[i:i + size] - start,
                            ifs[i:i + size], walk.section)
            o = stop
        if not o:
            raise _damage("truncated block", walk.number + 1, walk.pos)
        walk.pos += o


def _epb_run(w, n: int, start: int):
    """The offsets of the Enhanced Packet Blocks that follow one another whole from `start` in a chunk of n bytes
    (w: its 32-bit words; blocks start on a word) as an int64 array, empty where the block there is another; found
    at C speed as _chain finds pcap records: a candidate at each word that holds the block type, kept where its
    fields hold together (lengths, the trailing length), then _linked."""
    if start + 32 > n:
        return _NO_OFFSETS
    k = start // 4 + np.flatnonzero(w[start // 4:(n - 28) // 4 + 1] == BT_EPB)
    at, total = k * 4, w[k + 1].astype(np.int64)
    ends = at + total
    whole = (total >= 32) & (total & 3 == 0) & (ends <= n) & (w[k + 5] <= total - 32)
    at, ends = at[whole], ends[whole]
    same = w[ends // 4 - 1] == ends - at   # (the trailing length)
    at, ends = at[same], ends[same]
    return _linked(at, ends, start)[0]


class _Blocks:
    """Where a pcapng walk is: the file position, the block count, the section's interfaces."""

    def __init__(self):
        self.pos = self.number = 0
        self.section = pcapread._Section()

    def through(self, buf: bytes, o: int, size: int, packets: bool) -> tuple[list, list, int]:
        """The Enhanced Packet Blocks (offsets, interfaces) among the whole blocks of buf from o, at most `size`,
        and where those blocks end; without `packets`, only the other blocks, up to the first packet after them."""
        u32 = _U32.unpack_from
        offs, ifs, end = [], [], len(buf)
        while o + 12 <= end and len(offs) < size:
            btype, total = u32(buf, o)[0], u32(buf, o + 4)[0]
            if total < 12 or total & 3:
                raise _damage(f"block total length {total} is invalid", self.number + 1, self.pos + o)
            if o + total > end or btype == BT_EPB and not packets:
                break
            self.number += 1
            if btype == BT_EPB:
                if total < 32 or u32(buf, o + 20)[0] > total - 32:
                    raise _damage("an Enhanced Packet Block's captured length is past its end", self.number,
                                  self.pos + o)
                offs.append(o)
                ifs.append(u32(buf, o + 8)[0])
            elif btype in (BT_IDB, BT_SHB):
                self._section_block(btype, bytes(buf[o + 8:o + total - 4]))
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
        yield Batch(fields, np.frombuffer(data + bytes(_PAD), np.uint8))


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


__all__ = ["Batch", "FIELDS", "address", "batches", "decode", "pcap_batch"]
