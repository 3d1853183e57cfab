"""pcap and pcapng writers and readers: integer nanoseconds, symmetric, never printing."""

from __future__ import annotations

import os
import platform
import stat
import struct
from collections.abc import Iterator
from typing import BinaryIO, NamedTuple
from .errors import PcapFormatError

FORMATS = ("pcap", "pcapng")
DEFAULT_SNAPLEN = 262144

PCAP_MAGIC_US = 0xA1B2C3D4
PCAP_MAGIC_NS = 0xA1B23C4D
PCAP_MAGIC_KUZNETZOV = 0xA1B2CD34  # Alexey Kuznetzov's patched tcpdump: 24-byte record headers

# pcapng block types
BT_SHB = 0x0A0D0D0A  # Section Header Block (the same bytes in either byte order)
BT_IDB = 0x00000001  # Interface Description Block
BT_OPB = 0x00000002  # obsolete Packet Block
BT_SPB = 0x00000003  # Simple Packet Block
BT_ISB = 0x00000005  # Interface Statistics Block
BT_EPB = 0x00000006  # Enhanced Packet Block
BYTE_ORDER_MAGIC = 0x1A2B3C4D
PCAPNG_MAJOR, PCAPNG_MINOR = 1, 0

# pcapng option codes: any block, then per block type
OPT_ENDOFOPT = 0
OPT_COMMENT = 1
SHB_HARDWARE = 2
SHB_OS = 3
SHB_USERAPPL = 4
IF_NAME = 2
IF_DESCRIPTION = 3
IF_TSRESOL = 9
IF_TSOFFSET = 14
EPB_FLAGS = 2  # also pack_flags in the obsolete Packet Block
EPB_PACKETID = 5
ISB_STARTTIME, ISB_ENDTIME, ISB_IFRECV, ISB_IFDROP, ISB_FILTERACCEPT, ISB_OSDROP, ISB_USRDELIV = range(2, 9)
ISB_OPTIONS = {ISB_STARTTIME: "start_ns", ISB_ENDTIME: "end_ns", ISB_IFRECV: "ifrecv", ISB_IFDROP: "ifdrop",
               ISB_FILTERACCEPT: "filteraccept", ISB_OSDROP: "osdrop", ISB_USRDELIV: "usrdeliv"}   # -> field
ISB_TIMES = (ISB_STARTTIME, ISB_ENDTIME)   # timestamps (high, low u32s); the others are u64 counters

FLAG_INBOUND = 1  # epb_flags direction bits
FLAG_OUTBOUND = 2

_NS = 1_000_000_000
_IOV_MAX = 1024
_MAX_BLOCK = 1 << 28  # sanity bound on one pcapng block (libpcap's largest snaplen is 128 MiB)
_MAX_CAPLEN = {231: 128 * 1024 * 1024, 249: 1024 * 1024, 279: 8 * 1024 * 1024}  # DBUS, USBPCAP, EBHSCR
_SHB_TYPE = struct.pack("<I", BT_SHB)
_BYTE_ORDERS = {struct.pack("<I", BYTE_ORDER_MAGIC): "<", struct.pack(">I", BYTE_ORDER_MAGIC): ">"}


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


class Record(NamedTuple):
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


def format_for_path(path: str | os.PathLike) -> str:
    """"pcap" for .pcap/.cap/.dmp names, "pcapng" for .pcapng and anything else."""
    ext = os.path.splitext(os.fspath(path))[1].lower()
    return "pcap" if ext in (".pcap", ".cap", ".dmp") else "pcapng"


def open_writer(fileobj: BinaryIO, fmt: str = "pcapng", **kwargs) -> Writer:
    """A writer for fmt ("pcap" or "pcapng") on an open binary file object."""
    if fmt == "pcap":
        return PcapWriter(fileobj, **kwargs)
    if fmt == "pcapng":
        return PcapngWriter(fileobj, **kwargs)
    raise ValueError(f"unknown capture file format {fmt!r}; expected one of {', '.join(FORMATS)}")


# ---------------------------------------------------------------------------------------------- writers

class Writer:
    """Common interface: add_interface() then write() per packet; flush(); close()."""

    fmt = ""

    def __init__(self, fileobj: BinaryIO, closefd: bool = True) -> None:
        self._file = fileobj
        self._w = fileobj.write
        self._closefd = closefd
        self._fd: int | None = None
        self.closed = False

    def add_interface(self, name: str, linktype: int, snaplen: int = DEFAULT_SNAPLEN, description: str = "") -> int:
        raise NotImplementedError

    def write(self, ts_ns: int, data, orig_len: int, iface: int = 0, flags: int | None = None,
              comment: str | None = None, packet_id: int | None = None) -> None:
        raise NotImplementedError

    def writev(self, buffers: list) -> None:
        """Write bytes-like objects in order, as they are (records laid out by someone else): os.writev on the
        file's descriptor, after what write() left in the file object's buffer."""
        self.flush()
        fd = self._fileno()
        if fd < 0:
            self._w(b"".join(buffers))
            return
        written = 0
        try:
            for i in range(0, len(buffers), _IOV_MAX):
                batch = buffers[i:i + _IOV_MAX]
                done = os.writev(fd, batch)
                written += done
                want = sum(map(len, batch))
                if done < want:   # a pipe, a signal, a disk filling up: write what is left
                    rest = memoryview(b"".join(batch))[done:]
                    while rest:
                        n = os.write(fd, rest)
                        written += n
                        rest = rest[n:]
        except OSError:
            self._cut_to_whole_records(fd, buffers, written)
            raise

    def _cut_to_whole_records(self, fd: int, buffers: list, written: int) -> None:
        """After a failed write of whole records: a regular file loses the part of a record it got, so that it
        ends with the last whole one (a pipe's reader or a device keeps what it got)."""
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return
            end = os.lseek(fd, 0, os.SEEK_CUR)
            keep = whole_records(self.fmt, b"".join(bytes(b) for b in buffers)[:written])
            os.ftruncate(fd, end - written + keep)
            os.lseek(fd, end - written + keep, os.SEEK_SET)
        except OSError:
            pass

    def fileno(self) -> int:
        """The output's file descriptor, or -1 when it has none."""
        return self._fileno()

    def _fileno(self) -> int:
        if self._fd is None:
            try:
                self._fd = self._file.fileno()
            except (AttributeError, OSError, ValueError):
                self._fd = -1
        return self._fd

    def flush(self) -> None:
        flush = getattr(self._file, "flush", None)
        if flush is not None:
            flush()

    def close(self) -> None:
        """Flush, and close the file object unless the writer was made with closefd=False."""
        if self.closed:
            return
        self.closed = True
        self.flush()
        if self._closefd:
            self._file.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def whole_records(fmt: str, data: bytes) -> int:
    """How many leading bytes of `data` (records as a writer of `fmt` lays them out) are whole records."""
    at, n = 0, len(data)
    while True:
        if fmt == "pcap":
            size = 16 + struct.unpack_from("=I", data, at + 8)[0] if at + 16 <= n else n + 1
        else:
            size = struct.unpack_from("=I", data, at + 4)[0] if at + 8 <= n else n + 1
        if size <= 0 or at + size > n:
            return at
        at += size


def _check_snaplen(snaplen: int) -> int:
    if not 0 < snaplen <= 0xFFFFFFFF:
        raise ValueError(f"snaplen {snaplen} out of range 1..{0xFFFFFFFF}")
    return snaplen


class PcapWriter(Writer):
    """Classic pcap, nanosecond magic 0xa1b23c4d, native byte order; one linktype per file.

    Give linktype here, or call add_interface() once. pcap cannot hold interfaces, flags, comments or packet
    ids: write() accepts them for a common interface and drops them. Data longer than snaplen is truncated.
    """

    fmt = "pcap"
    _FILE_HDR = struct.Struct("=IHHiIII")
    _REC_HDR = struct.Struct("=IIII")

    def __init__(self, fileobj: BinaryIO, linktype: int | None = None, snaplen: int = DEFAULT_SNAPLEN,
                 closefd: bool = True) -> None:
        super().__init__(fileobj, closefd)
        self._snaplen = -1  # no header yet: every write takes the slow path and fails
        self.linktype: int | None = None
        if linktype is not None:
            self.add_interface("", linktype, snaplen)

    def add_interface(self, name: str, linktype: int, snaplen: int = DEFAULT_SNAPLEN, description: str = "") -> int:
        if self.linktype is not None:
            raise ValueError("a pcap file holds one interface; use pcapng for several")
        if not 0 <= linktype <= 0x03FFFFFF:
            raise ValueError(f"linktype {linktype} out of range")
        _check_snaplen(snaplen)
        self._w(self._FILE_HDR.pack(PCAP_MAGIC_NS, 2, 4, 0, 0, snaplen, linktype))
        self.linktype = linktype
        self._snaplen = snaplen
        return 0

    def write(self, ts_ns: int, data, orig_len: int, iface: int = 0, flags: int | None = None,
              comment: str | None = None, packet_id: int | None = None) -> None:
        n = len(data)
        if n > self._snaplen or iface:
            if self.linktype is None:
                raise ValueError("write before add_interface: the pcap header needs a linktype")
            if iface:
                raise ValueError(f"pcap has one interface (0); got iface {iface}")
            data = data[:self._snaplen]
            n = self._snaplen
        try:
            hdr = self._REC_HDR.pack(ts_ns // _NS, ts_ns % _NS, n, orig_len)
        except struct.error:
            raise ValueError(f"pcap cannot hold ts_ns={ts_ns} orig_len={orig_len} "
                             "(seconds and lengths are unsigned 32-bit)") from None
        self._w(hdr)
        self._w(data)


def _option(code: int, value: bytes) -> bytes:
    if len(value) > 0xFFFF:
        raise ValueError(f"pcapng option {code} is {len(value)} bytes; at most 65535 fit")
    return struct.pack("=HH", code, len(value)) + value + b"\0" * (-len(value) & 3)


def _block(btype: int, body: bytes) -> bytes:
    total = 12 + len(body)
    return struct.pack("=II", btype, total) + body + struct.pack("=I", total)


_END_OF_OPTIONS = struct.pack("=HH", OPT_ENDOFOPT, 0)


class PcapngWriter(Writer):
    """pcapng, native byte order: SHB at once, an IDB per add_interface() (also after packets), EPBs."""

    fmt = "pcapng"
    _EPB_HDR = struct.Struct("=IIIIIII")
    _TRAILER = tuple(struct.Struct(f"={pad}xI") for pad in range(4))
    _U32 = struct.Struct("=I")
    _OPT_U32 = struct.Struct("=HHI")
    _OPT_U64 = struct.Struct("=HHQ")

    def __init__(self, fileobj: BinaryIO, closefd: bool = True, userappl: str = "fcap") -> None:
        super().__init__(fileobj, closefd)
        self._snaplens: list[int] = []
        uname = platform.uname()
        opts = (_option(SHB_HARDWARE, uname.machine.encode())
                + _option(SHB_OS, f"{uname.system} {uname.release}".encode())
                + _option(SHB_USERAPPL, userappl.encode()) + _END_OF_OPTIONS)
        self._w(_block(BT_SHB, struct.pack("=IHHq", BYTE_ORDER_MAGIC, PCAPNG_MAJOR, PCAPNG_MINOR, -1) + opts))

    def add_interface(self, name: str, linktype: int, snaplen: int = DEFAULT_SNAPLEN, description: str = "") -> int:
        if not 0 <= linktype <= 0xFFFF:
            raise ValueError(f"linktype {linktype} out of range for pcapng (16 bits)")
        _check_snaplen(snaplen)
        opts = b""
        if name:
            opts += _option(IF_NAME, name.encode())
        if description:
            opts += _option(IF_DESCRIPTION, description.encode())
        opts += _option(IF_TSRESOL, b"\x09") + _END_OF_OPTIONS
        self._w(_block(BT_IDB, struct.pack("=HHI", linktype, 0, snaplen) + opts))
        self._snaplens.append(snaplen)
        return len(self._snaplens) - 1

    def write(self, ts_ns: int, data, orig_len: int, iface: int = 0, flags: int | None = None,
              comment: str | None = None, packet_id: int | None = None) -> None:
        n = len(data)
        try:
            snaplen = self._snaplens[iface]  # a negative iface passes here and fails in pack below
        except (IndexError, TypeError):
            raise ValueError(f"no interface {iface!r}; add_interface() defined {len(self._snaplens)}") from None
        if n > snaplen:
            data = data[:snaplen]
            n = snaplen
        pad = -n & 3
        if flags is None and comment is None and packet_id is None:
            opts = b""
            total = 32 + n + pad
        else:
            opts = self._packet_options(flags, comment, packet_id)
            total = 32 + n + pad + len(opts)
        try:
            hdr = self._EPB_HDR.pack(BT_EPB, total, iface, ts_ns >> 32, ts_ns & 0xFFFFFFFF, n, orig_len)
        except struct.error:
            raise ValueError(f"pcapng cannot hold ts_ns={ts_ns} orig_len={orig_len} iface={iface} (timestamp "
                             "unsigned 64-bit, length unsigned 32-bit, iface >= 0)") from None
        w = self._w
        w(hdr)
        w(data)
        if opts:
            w(b"\0" * pad + opts + self._U32.pack(total))
        else:
            w(self._TRAILER[pad].pack(total))

    def write_isb(self, iface: int, ts_ns: int, **options) -> None:
        """An Interface Statistics Block for interface `iface` at ts_ns (ns, as the interfaces' if_tsresol), with
        the options given by InterfaceStats' names (start_ns, end_ns, ifrecv, ... comment)."""
        if not 0 <= iface < len(self._snaplens):
            raise ValueError(f"no interface {iface!r}; add_interface() defined {len(self._snaplens)}")
        opts = b""
        for code, name in ISB_OPTIONS.items():
            v = options.pop(name, None)
            if v is not None:
                opts += _option(code, struct.pack("=II", v >> 32, v & 0xFFFFFFFF) if code in ISB_TIMES else
                                struct.pack("=Q", v))
        comment = options.pop("comment", None)
        if options:
            raise TypeError(f"write_isb: unknown options {', '.join(options)}")
        if comment is not None:
            opts += _option(OPT_COMMENT, comment.encode())
        self._w(_block(BT_ISB, struct.pack("=III", iface, ts_ns >> 32, ts_ns & 0xFFFFFFFF) +
                       (opts + _END_OF_OPTIONS if opts else b"")))

    def epb_parts(self, caplen: int, flags: int | None = None, comment: str | None = None,
                  packet_id: int | None = None) -> tuple[bytes, bytes]:
        """For an Enhanced Packet Block whose other header fields (interface, timestamp, lengths) and caplen data
        bytes are laid out elsewhere: the 8 bytes that start it (type, total length) and the padding, options
        and trailer that end it; together byte for byte what write() makes."""
        pad = -caplen & 3
        opts = b"" if flags is None and comment is None and packet_id is None else \
            self._packet_options(flags, comment, packet_id)
        total = 32 + caplen + pad + len(opts)
        return struct.pack("=II", BT_EPB, total), b"\0" * pad + opts + self._U32.pack(total)

    def _packet_options(self, flags: int | None, comment: str | None, packet_id: int | None) -> bytes:
        opts = b""
        try:
            if flags is not None:
                opts += self._OPT_U32.pack(EPB_FLAGS, 4, flags)
            if packet_id is not None:
                opts += self._OPT_U64.pack(EPB_PACKETID, 8, packet_id)
        except struct.error:
            raise ValueError(f"flags={flags} must fit 32 bits, packet_id={packet_id} 64 bits") from None
        if comment is not None:
            opts += _option(OPT_COMMENT, comment.encode())
        return opts + _END_OF_OPTIONS


# ---------------------------------------------------------------------------------------------- readers

def _read_exact(f: BinaryIO, n: int, what: str) -> bytes:
    if n <= 1 << 20:
        b = f.read(n) or b""
    else:  # a bogus length in a damaged file must not allocate its size before EOF is found
        parts, got = [], 0
        while got < n:
            chunk = f.read(min(n - got, 1 << 20))
            if not chunk:
                break
            parts.append(chunk)
            got += len(chunk)
        b = b"".join(parts)
    if len(b) != n:
        raise PcapFormatError(f"truncated file: {what} needs {n} bytes, only {len(b)} left")
    return b


def read(fileobj: BinaryIO | str | os.PathLike, stats: bool = False) -> Iterator[Record]:
    """Records of a pcap (any of the 4 magics) or pcapng file; the header is checked before this returns.
    With stats, a pcapng file's Interface Statistics Blocks come too, as InterfaceStats, where they are."""
    if isinstance(fileobj, (str, os.PathLike)):
        return _read_path(fileobj, stats)
    head = fileobj.read(4) or b""
    if len(head) < 4:
        raise PcapFormatError(f"not a capture file: only {len(head)} bytes")
    if head == _SHB_TYPE:
        return _read_pcapng(fileobj, head, stats)
    for endian in "<>":
        (magic,) = struct.unpack(endian + "I", head)
        if magic in (PCAP_MAGIC_US, PCAP_MAGIC_NS, PCAP_MAGIC_KUZNETZOV):
            return _read_pcap(fileobj, endian, magic)
    raise PcapFormatError(f"not a pcap or pcapng file: magic {head.hex()}")


def _read_path(path, stats: bool = False) -> Iterator[Record]:
    with open(path, "rb") as f:
        yield from read(f, stats)


def _read_pcap(f: BinaryIO, e: str, magic: int) -> Iterator[Record]:
    hdr = _read_exact(f, 20, "pcap file header")
    major, minor, _zone, _sigfigs, snaplen, network = struct.unpack(e + "HHiIII", hdr)
    if not ((major == 2 and minor <= 4) or (major, minor) == (543, 0)):
        raise PcapFormatError(f"unsupported pcap version {major}.{minor}")
    linktype = network & 0x03FFFFFF  # upper bits: FCS length
    maxcap = _MAX_CAPLEN.get(linktype, DEFAULT_SNAPLEN)
    if not 0 < snaplen <= maxcap:
        snaplen = maxcap
    swapped = 2 if major == 2 and minor < 3 else 1 if (major, minor) == (2, 3) else 0  # 1: maybe swapped
    scale = 1 if magic == PCAP_MAGIC_NS else 1000
    rec = struct.Struct(e + ("IIIIIHBx" if magic == PCAP_MAGIC_KUZNETZOV else "IIII"))
    size, unpack, read = rec.size, rec.unpack_from, f.read
    index = 0
    while True:
        h = read(size) or b""
        if len(h) < size:
            if h:
                raise PcapFormatError(f"truncated file: record {index} header has {len(h)} of {size} bytes")
            return
        sec, frac, caplen, length = unpack(h)[:4]
        if swapped == 2 or (swapped == 1 and caplen > length):
            caplen, length = length, caplen
        if caplen > maxcap:
            raise PcapFormatError(f"record {index}: capture length {caplen} exceeds the maximum {maxcap}")
        data = _read_exact(f, caplen, f"record {index} data")
        if caplen > snaplen:
            data = data[:snaplen]  # as libpcap does
        yield Record(sec * _NS + frac * scale, data, length, linktype)
        index += 1


class _Iface:
    __slots__ = ("div", "linktype", "mul", "name", "offset_ns", "shift", "snaplen")

    def __init__(self, linktype: int, snaplen: int, name: str | None) -> None:
        self.linktype, self.snaplen, self.name = linktype, snaplen, name
        self.mul, self.div, self.shift, self.offset_ns = 1000, 1, 0, 0  # default resolution: microseconds

    def ts_ns(self, ts: int) -> int:
        return ((ts * self.mul) >> self.shift) // self.div + self.offset_ns


def _options(body: bytes, off: int, e: str, where: str) -> list[tuple[int, bytes]]:
    """(code, value) pairs from body[off:], up to opt_endofopt or the end of the block."""
    out = []
    end = len(body)
    hdr = struct.Struct(e + "HH")
    while off + 4 <= end:
        code, length = hdr.unpack_from(body, off)
        off += 4
        if code == OPT_ENDOFOPT:
            break
        if off + length > end:
            raise PcapFormatError(f"{where}: option {code} of {length} bytes overruns the block")
        out.append((code, body[off:off + length]))
        off += (length + 3) & ~3
    return out


def _text(value: bytes) -> str:
    return value.decode("utf-8", "replace")


def _idb(body: bytes, e: str, where: str) -> _Iface:
    if len(body) < 8:
        raise PcapFormatError(f"{where}: Interface Description Block of {len(body) + 12} bytes is too short")
    linktype, _reserved, snaplen = struct.unpack_from(e + "HHI", body)
    iface = _Iface(linktype, snaplen, None)
    for code, value in _options(body, 8, e, where):
        if code == IF_NAME:
            iface.name = _text(value).rstrip("\0")
        elif code == IF_TSRESOL:
            if len(value) != 1:
                raise PcapFormatError(f"{where}: if_tsresol has length {len(value)}, not 1")
            iface.mul, iface.div, iface.shift = _tsresol(value[0])
        elif code == IF_TSOFFSET:
            if len(value) != 8:
                raise PcapFormatError(f"{where}: if_tsoffset has length {len(value)}, not 8")
            iface.offset_ns = struct.unpack(e + "q", value)[0] * _NS
    return iface


def _tsresol(v: int) -> tuple[int, int, int]:
    """(mul, div, shift) that turn a timestamp of resolution if_tsresol=v into nanoseconds."""
    exp = v & 0x7F
    if v & 0x80:  # 2^-exp seconds
        return _NS, 1, exp
    return (10 ** (9 - exp), 1, 0) if exp <= 9 else (1, 10 ** (exp - 9), 0)


def _packet_opts(body: bytes, off: int, e: str, where: str) -> tuple[int | None, str | None, int | None]:
    flags = comment = packet_id = None
    for code, value in _options(body, off, e, where):
        if code == OPT_COMMENT:
            text = _text(value)
            comment = text if comment is None else comment + "\n" + text
        elif code == EPB_FLAGS and len(value) == 4:
            flags = struct.unpack(e + "I", value)[0]
        elif code == EPB_PACKETID and len(value) == 8:
            packet_id = struct.unpack(e + "Q", value)[0]
    return flags, comment, packet_id


class _Section:
    """What a pcapng section's blocks depend on: its byte order, its interfaces so far."""

    __slots__ = ("e", "ifaces")

    def __init__(self) -> None:
        self.e, self.ifaces = "<", []


def _read_pcapng(f: BinaryIO, head: bytes, stats: bool = False) -> Iterator[Record]:
    section = _Section()
    index = 0  # block number, for messages
    h = head + _read_exact(f, 4, "pcapng block header")
    while h:
        where = f"block {index}"
        btype, total, body = _read_block(f, h, section, where)
        index += 1
        reader = _BLOCK_READERS.get(btype)
        # any other block (name resolution, statistics, decryption secrets, custom...) is skipped
        rec = reader(section, btype, body, total, where) if reader else None
        if rec is not None and (stats or type(rec) is Record):
            yield rec
        h = f.read(8) or b""
        if 0 < len(h) < 8:
            raise PcapFormatError(f"truncated file: block {index} header has {len(h)} of 8 bytes")


def _read_block(f: BinaryIO, h: bytes, section: _Section, where: str) -> tuple[int, int, bytes]:
    """The block whose first 8 bytes are h: its type, total length and body (without type, lengths)."""
    if h[:4] == _SHB_TYPE:
        return _read_shb(f, h, section, where)
    btype, total = struct.unpack(section.e + "II", h)
    if not 12 <= total <= _MAX_BLOCK or total % 4:
        raise PcapFormatError(f"{where}: block type {btype:#x} has a bad length {total}")
    rest = _read_exact(f, total - 8, f"{where} (type {btype:#x}, {total} bytes)")
    _check_trailer(rest, total, section.e, where)
    return btype, total, rest[:-4]


def _read_shb(f: BinaryIO, h: bytes, section: _Section, where: str) -> tuple[int, int, bytes]:
    """A Section Header Block: its byte-order magic sets the section's byte order; interface ids start again."""
    bom = _read_exact(f, 4, f"{where} byte-order magic")
    if bom not in _BYTE_ORDERS:
        raise PcapFormatError(f"{where}: Section Header Block has a bad byte-order magic {bom.hex()}")
    e = _BYTE_ORDERS[bom]
    btype, total = struct.unpack(e + "II", h)
    if not 28 <= total <= _MAX_BLOCK or total % 4:
        raise PcapFormatError(f"{where}: Section Header Block has a bad length {total}")
    rest = _read_exact(f, total - 12, f"{where} (Section Header Block)")
    body = bom + rest[:-4]
    major, minor = struct.unpack_from(e + "HH", body, 4)
    if major != PCAPNG_MAJOR:
        raise PcapFormatError(f"{where}: unsupported pcapng version {major}.{minor}")
    _check_trailer(rest, total, e, where)
    section.e, section.ifaces = e, []
    return btype, total, body


def _check_trailer(rest: bytes, total: int, e: str, where: str) -> None:
    (trailer,) = struct.unpack(e + "I", rest[-4:])
    if trailer != total:
        raise PcapFormatError(f"{where}: block length {total} in header but {trailer} in trailer")


def _interface_block(section: _Section, btype: int, body: bytes, total: int, where: str) -> None:
    section.ifaces.append(_idb(body, section.e, where))


def _packet_block(section: _Section, btype: int, body: bytes, total: int, where: str) -> Record:
    """An Enhanced Packet Block, or the obsolete Packet Block."""
    e = section.e
    name = "Enhanced Packet Block" if btype == BT_EPB else "Packet Block"
    if len(body) < 20:
        raise PcapFormatError(f"{where}: {name} of {total} bytes is too short")
    if btype == BT_EPB:
        iface_id, hi, lo, caplen, length = struct.unpack_from(e + "IIIII", body)
    else:
        iface_id, _drops, hi, lo, caplen, length = struct.unpack_from(e + "HHIIII", body)
    if 20 + caplen > len(body):
        raise PcapFormatError(f"{where}: {name} capture length {caplen} exceeds the block ({total} bytes)")
    if iface_id >= len(section.ifaces):
        raise PcapFormatError(f"{where}: packet on interface {iface_id}, "
                              f"but {len(section.ifaces)} interfaces are described")
    iface = section.ifaces[iface_id]
    flags, comment, packet_id = _packet_opts(body, 20 + ((caplen + 3) & ~3), e, where)
    return Record(iface.ts_ns((hi << 32) | lo), body[20:20 + caplen], length, iface.linktype, iface_id,
                  iface.name, flags, comment, packet_id)


def _simple_packet_block(section: _Section, btype: int, body: bytes, total: int, where: str) -> Record:
    if len(body) < 4:
        raise PcapFormatError(f"{where}: Simple Packet Block of {total} bytes is too short")
    if not section.ifaces:
        raise PcapFormatError(f"{where}: Simple Packet Block before any Interface Description Block")
    iface = section.ifaces[0]
    (length,) = struct.unpack_from(section.e + "I", body)
    caplen = min(length, len(body) - 4)
    if iface.snaplen:
        caplen = min(caplen, iface.snaplen)
    return Record(0, body[4:4 + caplen], length, iface.linktype, 0, iface.name)


def _statistics_block(section: _Section, btype: int, body: bytes, total: int, where: str) -> InterfaceStats:
    e = section.e
    if len(body) < 12:
        raise PcapFormatError(f"{where}: Interface Statistics Block of {total} bytes is too short")
    iface_id, hi, lo = struct.unpack_from(e + "III", body)
    if iface_id >= len(section.ifaces):
        raise PcapFormatError(f"{where}: statistics of interface {iface_id}, "
                              f"but {len(section.ifaces)} interfaces are described")
    iface = section.ifaces[iface_id]
    fields: dict = {}
    for code, value in _options(body, 12, e, where):
        if code == OPT_COMMENT:
            fields["comment"] = _text(value)
        elif code in ISB_TIMES and len(value) == 8:
            a, b = struct.unpack(e + "II", value)
            fields[ISB_OPTIONS[code]] = iface.ts_ns((a << 32) | b)
        elif code in ISB_OPTIONS and len(value) == 8:
            fields[ISB_OPTIONS[code]] = struct.unpack(e + "Q", value)[0]
    return InterfaceStats(iface_id, iface.ts_ns((hi << 32) | lo), iface.name, **fields)


_BLOCK_READERS = {BT_IDB: _interface_block, BT_EPB: _packet_block, BT_OPB: _packet_block,
                  BT_SPB: _simple_packet_block, BT_ISB: _statistics_block}
