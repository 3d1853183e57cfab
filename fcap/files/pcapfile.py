"""pcap and pcapng: the formats' constants and the writers (integer nanoseconds, never printing); fcap.files.pcapread
reads what they write."""

from __future__ import annotations

import os
import stat
import struct
from typing import BinaryIO

from fcap.defaults import NS, SNAPLEN

FORMATS = ("pcap", "pcapng")

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
BT_DSB = 0x0000000A  # Decryption Secrets Block
SECRETS_TLS_KEYLOG = 0x544C534B   # a DSB's secrets type: NSS's key log format ("TLSK")
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
EPB_HASH = 3   # a hash of the packet's bytes (not written: see README.md)
EPB_PACKETID = 5
EPB_QUEUE = 6
EPB_VERDICT = 7
VERDICT_HW, VERDICT_TC, VERDICT_XDP = 0, 1, 2   # epb_verdict types: opaque bytes, TC_ACT_* and XDP_* as 64 bits
# The per-packet options, in the order PcapngWriter writes them (and the capture program, fcap.kernel.ringrec, too)
EPB_OPTION_ORDER = (EPB_FLAGS, EPB_PACKETID, EPB_QUEUE, EPB_VERDICT, OPT_COMMENT)
OPT_CUSTOM = (2988, 2989, 19372, 19373)   # custom options: UTF-8 / binary, copyable / not; the value starts with a PEN
ISB_STARTTIME, ISB_ENDTIME, ISB_IFRECV, ISB_IFDROP, ISB_FILTERACCEPT, ISB_OSDROP, ISB_USRDELIV = range(2, 9)
ISB_OPTIONS = {ISB_STARTTIME: "start_ns", ISB_ENDTIME: "end_ns", ISB_IFRECV: "ifrecv", ISB_IFDROP: "ifdrop",
               ISB_FILTERACCEPT: "filteraccept", ISB_OSDROP: "osdrop", ISB_USRDELIV: "usrdeliv"}   # -> field
ISB_TIMES = (ISB_STARTTIME, ISB_ENDTIME)   # timestamps (high, low u32s); the others are u64 counters

FLAG_INBOUND = 1  # epb_flags direction bits
FLAG_OUTBOUND = 2

_IOV_MAX = 1024


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

    def add_interface(self, name: str, linktype: int, snaplen: int = SNAPLEN, description: str = "") -> int:
        raise NotImplementedError

    def write(self, ts_ns: int, data, orig_len: int, iface: int = 0, flags: int | None = None,
              comment: str | None = None, packet_id: int | None = None, comments: list | tuple = (),
              more: list | tuple = (), queue: int | None = None, verdict: tuple | None = None) -> int:
        """One record; returns the bytes it added to the file."""
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

    def write_iov(self, iov) -> None:
        """Write whole records that lie in memory (fcap.files.iovec: an (n, 2) array of address and length, one
        record each) in their order, after what write() left in the file object's buffer."""
        from fcap.files import iovec
        self.flush()
        fd = self._fileno()
        if fd < 0:
            self._w(iovec.gather(iov))
            return
        try:
            iovec.write_all(fd, iov)
        except OSError as e:
            done = getattr(e, "written", 0)
            self._truncate(fd, done, iovec.whole(iov, done))
            raise

    def _cut_to_whole_records(self, fd: int, buffers: list, written: int) -> None:
        """After a failed write of whole records: a regular file loses the part of a record it got, so that it
        ends with the last whole one (a pipe's reader or a device keeps what it got)."""
        self._truncate(fd, written, whole_records(self.fmt, b"".join(bytes(b) for b in buffers)[:written]))

    @staticmethod
    def _truncate(fd: int, written: int, keep: int) -> None:
        """A regular file whose last write stopped `written` bytes in: cut back to its first `keep` bytes."""
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return
            end = os.lseek(fd, 0, os.SEEK_CUR)
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

    def __init__(self, fileobj: BinaryIO, linktype: int | None = None, snaplen: int = SNAPLEN,
                 closefd: bool = True) -> None:
        super().__init__(fileobj, closefd)
        self._snaplen = -1  # no header yet: every write takes the slow path and fails
        self.linktype: int | None = None
        if linktype is not None:
            self.add_interface("", linktype, snaplen)

    def add_interface(self, name: str, linktype: int, snaplen: int = SNAPLEN, description: str = "") -> int:
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
              comment: str | None = None, packet_id: int | None = None, comments: list | tuple = (),
              more: list | tuple = (), queue: int | None = None, verdict: tuple | None = None) -> int:
        n = len(data)
        if n > self._snaplen or iface:
            if self.linktype is None:
                raise ValueError("write before add_interface: the pcap header needs a linktype")
            if iface:
                raise ValueError(f"pcap has one interface (0); got iface {iface}")
            data = data[:self._snaplen]
            n = self._snaplen
        try:
            hdr = self._REC_HDR.pack(ts_ns // NS, ts_ns % NS, n, orig_len)
        except struct.error:
            raise ValueError(f"pcap cannot hold ts_ns={ts_ns} orig_len={orig_len} "
                             "(seconds and lengths are unsigned 32-bit)") from None
        self._w(hdr)
        self._w(data)
        return len(hdr) + n


# the names of the eBPF verdicts (linux/bpf.h's enum xdp_action, linux/pkt_cls.h's TC_ACT_*)
XDP_ACTIONS = {0: "XDP_ABORTED", 1: "XDP_DROP", 2: "XDP_PASS", 3: "XDP_TX", 4: "XDP_REDIRECT"}
TC_ACTIONS = {-1: "TC_ACT_UNSPEC", 0: "TC_ACT_OK", 1: "TC_ACT_RECLASSIFY", 2: "TC_ACT_SHOT", 3: "TC_ACT_PIPE",
              4: "TC_ACT_STOLEN", 5: "TC_ACT_QUEUED", 6: "TC_ACT_REPEAT", 7: "TC_ACT_REDIRECT", 8: "TC_ACT_TRAP"}


def verdict_name(vtype: int, value) -> str | None:
    """XDP_DROP, TC_ACT_SHOT, ... of an eBPF verdict (the number where it has no name); None for other types."""
    names = {VERDICT_TC: TC_ACTIONS, VERDICT_XDP: XDP_ACTIONS}.get(vtype)
    return None if names is None else names.get(value, str(value))


def verdict_value(vtype: int, value) -> bytes:
    """An epb_verdict's value: its type, then TC_ACT_* / XDP_* as a signed 64-bit number, or opaque bytes."""
    if vtype in (VERDICT_TC, VERDICT_XDP):
        return bytes([vtype]) + struct.pack("=q", value)
    return bytes([vtype]) + bytes(value)


def _option(code: int, value: bytes) -> bytes:
    if len(value) > 0xFFFF:
        raise ValueError(f"pcapng option {code} is {len(value)} bytes; at most 65535 fit")
    return struct.pack("=HH", code, len(value)) + value + b"\0" * (-len(value) & 3)


def further_options(comments: list | tuple, more: list | tuple) -> bytes:
    """The options an EPB carries after its own, as PcapngWriter lays them out: an opt_comment per text of
    `comments`, then each (code, value) of `more`."""
    return b"".join([_option(OPT_COMMENT, text.encode()) for text in comments] +
                    [_option(code, value) for code, value in more])


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
        uname = os.uname()   # (platform.uname() says the same; importing platform costs a start ~5 ms)
        opts = (_option(SHB_HARDWARE, uname.machine.encode())
                + _option(SHB_OS, f"{uname.sysname} {uname.release}".encode())
                + _option(SHB_USERAPPL, userappl.encode()) + _END_OF_OPTIONS)
        self._w(_block(BT_SHB, struct.pack("=IHHq", BYTE_ORDER_MAGIC, PCAPNG_MAJOR, PCAPNG_MINOR, -1) + opts))

    def add_interface(self, name: str, linktype: int, snaplen: int = SNAPLEN, description: str = "") -> int:
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
              comment: str | None = None, packet_id: int | None = None, comments: list | tuple = (),
              more: list | tuple = (), queue: int | None = None, verdict: tuple | None = None) -> int:
        """One EPB; `comments`: further opt_comments after `comment`, `more`: further (code, value) options;
        `queue` (epb_queue), `verdict` (epb_verdict: (type, value))."""
        n = len(data)
        try:
            snaplen = self._snaplens[iface]  # a negative iface passes here and fails in pack below
        except (IndexError, TypeError):
            raise ValueError(f"no interface {iface!r}; add_interface() defined {len(self._snaplens)}") from None
        if n > snaplen:
            data = data[:snaplen]
            n = snaplen
        pad = -n & 3
        if flags is None and comment is None and packet_id is None and queue is None and verdict is None \
                and not comments and not more:
            opts = b""
            total = 32 + n + pad
        else:
            opts = self._packet_options(flags, comment, packet_id, comments, more, queue, verdict)
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
        return total

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

    def write_dsb(self, secrets: bytes, secrets_type: int = SECRETS_TLS_KEYLOG) -> None:
        """A Decryption Secrets Block: Wireshark decrypts the packets after it with these secrets (TLS: key log
        lines, NSS's format)."""
        self._w(_block(BT_DSB, struct.pack("=II", secrets_type, len(secrets)) + secrets + b"\0" * (-len(secrets) & 3)))

    def epb_parts(self, caplen: int, flags: int | None = None, comment: str | None = None,
                  packet_id: int | None = None, comments: list | tuple = (), more: list | tuple = (),
                  queue: int | None = None, verdict: tuple | None = None) -> tuple[bytes, bytes]:
        """For an Enhanced Packet Block whose other header fields (interface, timestamp, lengths) and caplen data
        bytes are laid out elsewhere: the 8 bytes that start it (type, total length) and the padding, options
        and trailer that end it; together byte for byte what write() makes."""
        pad = -caplen & 3
        opts = b"" if flags is None and comment is None and packet_id is None and queue is None and \
            verdict is None and not comments and not more else \
            self._packet_options(flags, comment, packet_id, comments, more, queue, verdict)
        total = 32 + caplen + pad + len(opts)
        return struct.pack("=II", BT_EPB, total), b"\0" * pad + opts + self._U32.pack(total)

    def _packet_options(self, flags: int | None, comment: str | None, packet_id: int | None,
                        comments: list | tuple = (), more: list | tuple = (), queue: int | None = None,
                        verdict: tuple | None = None) -> bytes:
        """In EPB_OPTION_ORDER, then the further comments and options."""
        opts = b""
        try:
            if flags is not None:
                opts += self._OPT_U32.pack(EPB_FLAGS, 4, flags)
            if packet_id is not None:
                opts += self._OPT_U64.pack(EPB_PACKETID, 8, packet_id)
            if queue is not None:
                opts += self._OPT_U32.pack(EPB_QUEUE, 4, queue)
        except struct.error:
            raise ValueError(f"flags={flags}, queue={queue} must fit 32 bits, packet_id={packet_id} 64 bits") from None
        if verdict is not None:
            opts += _option(EPB_VERDICT, verdict_value(*verdict))
        if comment is not None:
            opts += _option(OPT_COMMENT, comment.encode())
        return opts + further_options(comments, more) + _END_OF_OPTIONS
