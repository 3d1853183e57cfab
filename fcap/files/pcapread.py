"""pcap and pcapng readers: records in integer nanoseconds; a damaged file yields every record before the damage,
then raises PcapFormatError saying what is wrong (in libpcap's words where libpcap has some) and where."""

from __future__ import annotations

import os
import struct
from collections.abc import Callable, Iterator
from typing import BinaryIO, NamedTuple

from fcap.defaults import NS, SNAPLEN
from fcap.errors import PcapFormatError
from fcap.files.pcapfile import (BT_EPB, BT_IDB, BT_ISB, BT_OPB, BT_SHB, BT_SPB, BYTE_ORDER_MAGIC, EPB_FLAGS,
                       EPB_PACKETID, EPB_QUEUE, EPB_VERDICT, IF_NAME, IF_TSOFFSET, IF_TSRESOL, ISB_OPTIONS, ISB_TIMES,
                       OPT_COMMENT, OPT_CUSTOM, OPT_ENDOFOPT, PCAPNG_MAJOR, PCAP_MAGIC_KUZNETZOV, PCAP_MAGIC_NS,
                       PCAP_MAGIC_US, VERDICT_TC, VERDICT_XDP)

_CHUNK = 1 << 20
_MAX_BLOCK = 1 << 28  # sanity bound on one pcapng block (libpcap's largest snaplen is 128 MiB)
_MAX_CAPLEN = {231: 128 * 1024 * 1024, 249: 1024 * 1024, 279: 8 * 1024 * 1024}  # DBUS, USBPCAP, EBHSCR
_SHB_TYPE = struct.pack("<I", BT_SHB)
_BYTE_ORDERS = {struct.pack("<I", BYTE_ORDER_MAGIC): "<", struct.pack(">I", BYTE_ORDER_MAGIC): ">"}
_BLOCK_NAMES = {BT_SHB: "Section Header Block", BT_IDB: "Interface Description Block", BT_OPB: "Packet Block",
                BT_SPB: "Simple Packet Block", 4: "Name Resolution Block", BT_ISB: "Interface Statistics Block",
                BT_EPB: "Enhanced Packet Block", 10: "Decryption Secrets Block"}


class InterfaceStats(NamedTuple):
    """An Interface Statistics Block as read (read(..., stats=True)): counters the block lacks are None;
    timestamps in ns as the interface's resolution gives them."""

    iface: int
    ts_ns: int
    iface_name: str | None = None
    start_ns: int | None = None
    end_ns: int | None = None
    ifrecv: int | None = None
    ifdrop: int | None = None
    filteraccept: int | None = None
    osdrop: int | None = None
    usrdeliv: int | None = None
    comment: str | None = None


class FileRecord(NamedTuple):
    """One packet as read from a file; the fields pcap cannot hold are None."""

    ts_ns: int
    data: bytes
    orig_len: int
    linktype: int
    iface: int = 0
    iface_name: str | None = None
    flags: int | None = None
    comment: str | None = None
    packet_id: int | None = None
    custom: tuple = ()          # pcapng custom options of the packet: (code, value after the option header)
    queue: int | None = None    # epb_queue
    verdict: tuple | None = None   # epb_verdict: (type, value): an int for TC/XDP, bytes otherwise
    stamp: tuple | None = None  # an odd pcap timestamp as the file holds it (_odd_stamp): (sec, frac, per second)


def read(source: BinaryIO | str | os.PathLike, stats: bool = False) -> Iterator[FileRecord]:
    """Records of a pcap (any of the 4 magics) or pcapng file, a path or a binary file object (a pipe too).
    Given a file object, its first bytes are checked before this returns. With stats, a pcapng file's Interface
    Statistics Blocks come too, as InterfaceStats, where they are."""
    if isinstance(source, (str, os.PathLike)):
        return _read_path(source, stats)
    return _records(_Input(source), stats)


def _read_path(path, stats: bool) -> Iterator[FileRecord]:
    with open(path, "rb") as f:
        yield from _records(_Input(f), stats)


class _Input:
    """The file being read and how many bytes of it have been: reads that allocate no more than the file holds,
    whatever length a damaged header asks for."""

    __slots__ = ("f", "pos")

    def __init__(self, f: BinaryIO) -> None:
        self.f, self.pos = f, 0

    def read(self, n: int) -> bytes:
        """Up to n bytes: fewer only at the end of the file."""
        if n <= _CHUNK:
            b = self.f.read(n) or b""
        else:
            parts, got = [], 0
            while got < n:
                chunk = self.f.read(min(n - got, _CHUNK))
                if not chunk:
                    break
                parts.append(chunk)
                got += len(chunk)
            b = b"".join(parts)
        self.pos += len(b)
        return b


def _records(inp: _Input, stats: bool = False) -> Iterator[FileRecord]:
    head = inp.read(4)
    if len(head) < 4:
        raise PcapFormatError(f"truncated dump file; tried to read 4 file header bytes, only got {len(head)}")
    if head == _SHB_TYPE:
        return _read_pcapng(inp, head, stats)
    for endian in "<>":
        (magic,) = struct.unpack(endian + "I", head)
        if magic in (PCAP_MAGIC_US, PCAP_MAGIC_NS, PCAP_MAGIC_KUZNETZOV):
            return _read_pcap(inp, endian, magic)
    raise PcapFormatError(f"unknown file format: neither pcap nor pcapng (it starts with {head.hex()})")


# ---------------------------------------------------------------------------------------------- pcap

def _read_pcap(inp: _Input, e: str, magic: int) -> Iterator[FileRecord]:
    hdr = inp.read(20)
    if len(hdr) < 20:
        raise PcapFormatError(f"truncated dump file; tried to read 24 file header bytes, only got {4 + len(hdr)}")
    major, minor, _zone, _sigfigs, snaplen, network = struct.unpack(e + "HHiIII", hdr)
    if major < 2:
        raise PcapFormatError(f"archaic pcap savefile format (version {major}.{minor})")
    if not ((major == 2 and minor <= 4) or (major, minor) == (543, 0)):
        raise PcapFormatError(f"unsupported pcap savefile version {major}.{minor}")
    linktype = network & 0x03FFFFFF  # upper bits: FCS length
    maxcap = _MAX_CAPLEN.get(linktype, SNAPLEN)
    if not 0 < snaplen <= maxcap:
        snaplen = maxcap
    swapped = 2 if major == 2 and minor < 3 else 1 if (major, minor) == (2, 3) else 0  # 1: maybe swapped
    scale = 1 if magic == PCAP_MAGIC_NS else 1000
    rec = struct.Struct(e + ("IIIIIHBx" if magic == PCAP_MAGIC_KUZNETZOV else "IIII"))
    size, unpack, read = rec.size, rec.unpack_from, inp.read
    number = 0
    while True:
        at = inp.pos
        h = read(size)
        if len(h) < size:
            if h:
                raise _damage(f"truncated dump file; tried to read {size} header bytes, only got {len(h)}",
                              f"packet {number + 1} at byte {at}")
            return
        number += 1
        sec, frac, caplen, length = unpack(h)[:4]
        if swapped == 2 or (swapped == 1 and caplen > length):
            caplen, length = length, caplen
        if caplen > maxcap:
            limit = f"snaplen of {snaplen}" if caplen > snaplen else f"maximum of {maxcap}"
            raise _damage(f"invalid packet capture length {caplen}, bigger than {limit}",
                          f"packet {number} at byte {at}")
        data = read(caplen)
        if len(data) < caplen:
            raise _damage(f"truncated dump file; tried to read {caplen} captured bytes, only got {len(data)}",
                          f"packet {number} at byte {at}")
        if caplen > snaplen:
            data = data[:snaplen]  # as libpcap does
        yield FileRecord(ts_ns=sec * NS + frac * scale, data=data, orig_len=length, linktype=linktype,
                         stamp=_odd_stamp(sec, frac, NS // scale))


def _odd_stamp(sec: int, frac: int, per_second: int) -> tuple | None:
    """The timestamp of a pcap record as its fields hold it when ts_ns cannot say how tcpdump prints it, a fraction
    field of one second or more (libpcap passes it on as it is); else None. (Seconds past 2**31 are a time after
    2038 in ts_ns, where tcpdump, reading them as int32, prints "[Error converting time]".)"""
    return (sec, frac, per_second) if frac >= per_second else None


def _damage(what: str, where: str) -> PcapFormatError:
    return PcapFormatError(f"{what} ({where})")


# ---------------------------------------------------------------------------------------------- pcapng

class _Iface:
    __slots__ = ("div", "linktype", "mul", "name", "offset_ns", "shift", "snaplen")

    def __init__(self, linktype: int, snaplen: int, name: str | None) -> None:
        self.linktype, self.snaplen, self.name = linktype, snaplen, name
        self.mul, self.div, self.shift, self.offset_ns = 1000, 1, 0, 0  # default resolution: microseconds

    def ts_ns(self, ts: int) -> int:
        return ((ts * self.mul) >> self.shift) // self.div + self.offset_ns


class _Section:
    """What a pcapng section's blocks depend on: its byte order, its interfaces so far."""

    __slots__ = ("e", "ifaces")

    def __init__(self) -> None:
        self.e, self.ifaces = "<", []


def _read_pcapng(inp: _Input, head: bytes, stats: bool) -> Iterator[FileRecord]:
    section = _Section()
    number = 0  # block number (from 1), for messages
    h = head + inp.read(4)
    while h:
        number += 1
        at = inp.pos - len(h)
        btype = BT_SHB if h[:4] == _SHB_TYPE else struct.unpack(section.e + "I", h[:4])[0] if len(h) >= 4 else None
        try:
            if len(h) < 8:
                raise PcapFormatError(f"truncated pcapng dump file; tried to read 8 bytes, only got {len(h)}")
            body = _read_block(inp, h, section)
            reader = _BLOCK_READERS.get(btype) if stats or btype != BT_ISB else None
            # any other block (name resolution, decryption secrets, custom...) is skipped; statistics unless asked
            # for (libpcap skips them)
            rec = reader(section, btype, body) if reader else None
        except PcapFormatError as e:
            raise _damage(str(e), _block_where(number, btype, at)) from None
        if rec is not None:
            yield rec
        h = inp.read(8)


def _block_where(number: int, btype: int | None, at: int) -> str:
    """Where a block is, for messages: "block 3, an Enhanced Packet Block at byte 60"."""
    if btype is None:
        return f"block {number} at byte {at}"
    name = _BLOCK_NAMES.get(btype, f"block of type {btype:#x}")
    return f"block {number}, {'an' if name[0] in 'AEIOU' else 'a'} {name} at byte {at}"


def _read_block(inp: _Input, h: bytes, section: _Section) -> bytes:
    """The body (without type, lengths) of the block whose first 8 bytes are h."""
    if h[:4] == _SHB_TYPE:
        return _read_shb(inp, h, section)
    (total,) = struct.unpack_from(section.e + "I", h, 4)
    if total < 12:
        raise PcapFormatError(f"block in pcapng dump file has a length of {total} < 12")
    if total % 4:
        raise PcapFormatError(f"block in pcapng dump file has a length of {total} that is not a multiple of 4")
    if total > _MAX_BLOCK:
        raise PcapFormatError(f"pcapng block size {total} > maximum {_MAX_BLOCK}")
    rest = _read_rest(inp, total - 8)
    _check_trailer(rest, total, section.e)
    return rest[:-4]


def _read_rest(inp: _Input, n: int) -> bytes:
    rest = inp.read(n)
    if len(rest) < n:
        raise PcapFormatError(f"truncated pcapng dump file; tried to read {n} bytes, only got {len(rest)}")
    return rest


def _read_shb(inp: _Input, h: bytes, section: _Section) -> bytes:
    """A Section Header Block: its byte-order magic sets the section's byte order; interface ids start again."""
    bom = inp.read(4)
    if len(bom) < 4:
        raise PcapFormatError(f"truncated pcapng dump file; tried to read 4 bytes, only got {len(bom)}")
    if bom not in _BYTE_ORDERS:
        raise PcapFormatError(f"unknown byte-order magic {bom.hex()}")
    e = _BYTE_ORDERS[bom]
    (total,) = struct.unpack_from(e + "I", h, 4)
    if not 28 <= total <= _MAX_BLOCK or total % 4:
        raise PcapFormatError(f"Section Header Block in pcapng dump file has invalid length {total}")
    rest = _read_rest(inp, total - 12)
    body = bom + rest[:-4]
    major, minor = struct.unpack_from(e + "HH", body, 4)
    if major != PCAPNG_MAJOR:
        raise PcapFormatError(f"unsupported pcapng savefile version {major}.{minor}")
    _check_trailer(rest, total, e)
    section.e, section.ifaces = e, []
    return body


def _check_trailer(rest: bytes, total: int, e: str) -> None:
    (trailer,) = struct.unpack(e + "I", rest[-4:])
    if trailer != total:
        raise PcapFormatError(f"block total length in header and trailer don't match: {total} and {trailer}")


def _too_short(btype: int, detail: str = "") -> PcapFormatError:
    more = f": {detail}" if detail else ""
    return PcapFormatError(f"block of type {btype} in pcapng dump file is too short{more}")


def _options(body: bytes, off: int, e: str, btype: int, strict: bool) -> list[tuple[int, bytes]]:
    """(code, value) pairs from body[off:], up to opt_endofopt or the end of the block. An option running past
    the block is an error when strict, else the end of the options (as libpcap, which reads no packet options)."""
    out = []
    end = len(body)
    hdr = struct.Struct(e + "HH")
    while off + 4 <= end:
        code, length = hdr.unpack_from(body, off)
        off += 4
        if code == OPT_ENDOFOPT:
            break
        if off + length > end:
            if strict:
                raise _too_short(btype, f"option {code} of {length} bytes runs past its end")
            break
        out.append((code, body[off:off + length]))
        off += (length + 3) & ~3
    return out


def _text(value: bytes) -> str:
    return value.decode("utf-8", "replace")


def _interface_block(section: _Section, btype: int, body: bytes) -> None:
    if len(body) < 8:
        raise _too_short(btype)
    e = section.e
    linktype, _reserved, snaplen = struct.unpack_from(e + "HHI", body)
    iface = _Iface(linktype, snaplen, None)
    for code, value in _options(body, 8, e, btype, strict=True):
        if code == IF_NAME:
            iface.name = _text(value).rstrip("\0")
        elif code == IF_TSRESOL:
            if len(value) != 1:
                raise PcapFormatError("Interface Description Block has if_tsresol option with length "
                                      f"{len(value)} != 1")
            iface.mul, iface.div, iface.shift = _tsresol(value[0])
        elif code == IF_TSOFFSET:
            if len(value) != 8:
                raise PcapFormatError(f"Interface Description Block has if_tsoffset option with length {len(value)} "
                                      "!= 8")
            iface.offset_ns = struct.unpack(e + "q", value)[0] * NS
    section.ifaces.append(iface)


def _tsresol(v: int) -> tuple[int, int, int]:
    """(mul, div, shift) that turn a timestamp of resolution if_tsresol=v into nanoseconds (as libpcap: at most
    10^-19 or 2^-63 s, what a 64-bit count of units per second holds)."""
    exp = v & 0x7F
    if v & 0x80:  # 2^-exp seconds
        if exp > 63:
            raise PcapFormatError(f"Interface Description Block if_tsresol option resolution 2^-{exp} is too high")
        return NS, 1, exp
    if exp > 19:
        raise PcapFormatError(f"Interface Description Block if_tsresol option resolution 10^-{exp} is too high")
    return (10 ** (9 - exp), 1, 0) if exp <= 9 else (1, 10 ** (exp - 9), 0)


def _packet_opts(body: bytes, off: int, e: str, btype: int) -> dict:
    """A packet block's options, by their FileRecord field names."""
    flags = comment = packet_id = queue = verdict = None
    custom = []
    for code, value in _options(body, off, e, btype, strict=False):
        if code == OPT_COMMENT:
            text = _text(value)
            comment = text if comment is None else comment + "\n" + text
        elif code == EPB_FLAGS and len(value) == 4:
            flags = struct.unpack(e + "I", value)[0]
        elif code == EPB_PACKETID and len(value) == 8:
            packet_id = struct.unpack(e + "Q", value)[0]
        elif code == EPB_QUEUE and len(value) == 4:
            queue = struct.unpack(e + "I", value)[0]
        elif code == EPB_VERDICT and value:
            verdict = _verdict(value, e)
        elif code in OPT_CUSTOM:
            custom.append((code, value))
    return {"flags": flags, "comment": comment, "packet_id": packet_id, "custom": tuple(custom), "queue": queue,
            "verdict": verdict}


def _verdict(value: bytes, e: str) -> tuple:
    vtype = value[0]
    if vtype in (VERDICT_TC, VERDICT_XDP) and len(value) == 9:
        return vtype, struct.unpack(e + "q", value[1:])[0]
    return vtype, bytes(value[1:])


def _no_interface(section: _Section, iface_id: int) -> PcapFormatError:
    if not section.ifaces:
        return PcapFormatError("the capture file has a packet block before any Interface Description Blocks")
    return PcapFormatError(f"a packet arrived on interface {iface_id}, but there's no Interface Description Block "
                           "for that interface")


def _packet_block(section: _Section, btype: int, body: bytes) -> FileRecord:
    """An Enhanced Packet Block, or the obsolete Packet Block."""
    e = section.e
    if len(body) < 20:
        raise _too_short(btype)
    if btype == BT_EPB:
        iface_id, hi, lo, caplen, length = struct.unpack_from(e + "IIIII", body)
    else:
        iface_id, _drops, hi, lo, caplen, length = struct.unpack_from(e + "HHIIII", body)
    if 20 + caplen > len(body):
        raise _too_short(btype, f"capture length {caplen} in a block of {len(body) + 12} bytes")
    if iface_id >= len(section.ifaces):
        raise _no_interface(section, iface_id)
    iface = section.ifaces[iface_id]
    return FileRecord(ts_ns=iface.ts_ns((hi << 32) | lo), data=body[20:20 + caplen], orig_len=length,
                  linktype=iface.linktype, iface=iface_id, iface_name=iface.name,
                  **_packet_opts(body, 20 + ((caplen + 3) & ~3), e, btype))


def _simple_packet_block(section: _Section, btype: int, body: bytes) -> FileRecord:
    if len(body) < 4:
        raise _too_short(btype)
    if not section.ifaces:
        raise _no_interface(section, 0)
    iface = section.ifaces[0]
    (length,) = struct.unpack_from(section.e + "I", body)
    caplen = min(length, len(body) - 4)
    if iface.snaplen:
        caplen = min(caplen, iface.snaplen)
    return FileRecord(ts_ns=0, data=body[4:4 + caplen], orig_len=length, linktype=iface.linktype, iface_name=iface.name)


def _statistics_block(section: _Section, btype: int, body: bytes) -> InterfaceStats:
    e = section.e
    if len(body) < 12:
        raise _too_short(btype)
    iface_id, hi, lo = struct.unpack_from(e + "III", body)
    if iface_id >= len(section.ifaces):
        raise PcapFormatError(f"statistics of interface {iface_id}, but there's no Interface Description Block "
                              "for that interface")
    iface = section.ifaces[iface_id]
    fields: dict = {}
    for code, value in _options(body, 12, e, btype, strict=False):
        if code == OPT_COMMENT:
            fields["comment"] = _text(value)
        elif code in ISB_TIMES and len(value) == 8:
            a, b = struct.unpack(e + "II", value)
            fields[ISB_OPTIONS[code]] = iface.ts_ns((a << 32) | b)
        elif code in ISB_OPTIONS and len(value) == 8:
            fields[ISB_OPTIONS[code]] = struct.unpack(e + "Q", value)[0]
    return InterfaceStats(iface_id, iface.ts_ns((hi << 32) | lo), iface.name, **fields)


_BLOCK_READERS: dict[int, Callable] = {BT_IDB: _interface_block, BT_EPB: _packet_block, BT_OPB: _packet_block,
                                       BT_SPB: _simple_packet_block, BT_ISB: _statistics_block}
