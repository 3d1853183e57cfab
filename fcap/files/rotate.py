"""-C, -G, -W: the output as a series of capture files, named and cut as tcpdump names and cuts them, each file a
complete capture on its own (its own file header; pcapng: the SHB and every IDB again)."""

from __future__ import annotations

import struct
import time
from typing import BinaryIO, Callable, NamedTuple

from fcap.defaults import FILE_BUFFERING

MILLION = 1_000_000      # -C counts millions of bytes, as tcpdump's
_U32 = struct.Struct("=I")
# where a record's length is, and the smallest record: pcap (16-byte header, caplen at +8, the header not counted),
# pcapng (the block's total length at +4)
_LENGTH = {"pcap": (8, 16, 16), "pcapng": (4, 0, 12)}


class RotationPlan(NamedTuple):
    """What the flags ask for: -C SIZE (bytes, 0: no size limit), -G SECONDS (0: no interval), -W FILES (0: no
    limit)."""

    size: int = 0
    seconds: int = 0
    files: int = 0

    @property
    def chars(self) -> int:
        """Digits of the file counter, as tcpdump's getWflagChars: those of FILES - 1 (no -W: none)."""
        return len(str(self.files - 1)) if self.files > 1 else 0

    @property
    def active(self) -> bool:
        return bool(self.size or self.seconds)


def file_name(template: str, count: int, chars: int, start: int | None) -> str:
    """tcpdump's MakeFilename: TEMPLATE through strftime at START's local time (-G), then COUNT padded to CHARS
    digits, except for the first file when there is nothing to pad ("x", "x1", "x2"; -W 10: "x0" ... "x9")."""
    name = time.strftime(template, time.localtime(start)) if start is not None else template
    if count == 0 and chars == 0:
        return name
    return f"{name}{count:0{chars}d}" if chars else f"{name}{count}"


class RotatingWriter:
    """The writer the drains and a file sink write to (fmt, write, writev, epb_parts, flush, fileno, close), over a
    series of files.
    `start(fileobj)` makes a capture file's writer, its header and interfaces written. -C: before each record, a
    file already larger than SIZE is closed and the next one opened (tcpdump's test); -G: tick() opens the next
    file once SECONDS have passed. Batches are whole records; one is cut at a record boundary only when a -C
    rotation falls inside it."""

    def __init__(self, template: str, plan: RotationPlan, fmt: str, start: Callable[[BinaryIO], object]):
        self.template = template
        self.plan = plan
        self.fmt = fmt
        self._start = start
        self.count = 0            # the -C counter in the name (tcpdump's Cflag_count)
        self.intervals = 0        # -G intervals ended (tcpdump's Gflag_count)
        self.since = int(time.time()) if plan.seconds else None   # this interval's start: the name's time
        self.writer = None
        self.path = ""
        self.names: dict[str, None] = {}   # the names opened, once each, in order (as many as files on disk)
        self.opened = 0           # files opened
        self.size = 0             # bytes in the current file
        self.fresh = True         # the current file holds no record yet
        self.done = False         # -G with -W: the last file's interval is over
        self.error: OSError | None = None   # closing a file or opening the next failed: the output is done
        self._open()

    @property
    def paths(self) -> list[str]:
        return list(self.names)

    # -- the writer interface --------------------------------------------------------------------------------
    def writev(self, buffers: list) -> None:
        self._check()
        limit = self.plan.size
        if not limit:
            self._write(buffers)
            return
        made: list[memoryview] = []       # the views cut here, released when written
        try:
            total = sum(map(len, buffers))
            while self.size + total > limit:
                at = _first_past(buffers, self.fmt, limit - self.size, total)
                if at is None or (at == 0 and self.fresh):
                    break
                if at:
                    head, buffers = _cut(buffers, at, made)
                    self._write(head)
                    total -= at
                self.rotate()
            self._write(buffers)
        finally:
            for v in made:
                v.release()

    def write(self, *args, **kwargs) -> None:
        """One record the file's writer lays out (its write(): what user space lays out, --dump, --stack, --nft):
        in the next file when this one is already larger than -C's size, as tcpdump tests before each packet."""
        self._check()
        if self.plan.size and self.size > self.plan.size and not self.fresh:
            self.rotate()
        self.size += self.writer.write(*args, **kwargs)
        self.fresh = False

    def write_iov(self, iov) -> None:
        """writev() for records that lie in memory (fcap.files.iovec): cut between records where -C rotates."""
        from fcap.files import iovec
        self._check()
        limit = self.plan.size
        while limit and len(iov) and self.size + iovec.total(iov) > limit:
            at = iovec.first_past(iov, limit - self.size)
            if at == len(iov) or (at == 0 and self.fresh):
                break
            if at:
                self._write_iov(iov[:at])
                iov = iov[at:]
            self.rotate()
        self._write_iov(iov)

    def _write_iov(self, iov) -> None:
        if len(iov):
            from fcap.files import iovec
            self.writer.write_iov(iov)
            self.size += iovec.total(iov)
            self.fresh = False

    def epb_parts(self, *args, **kwargs):
        return self.writer.epb_parts(*args, **kwargs)

    def flush(self) -> None:
        if self.writer is not None:
            self.writer.flush()

    def fileno(self) -> int:
        return self.writer.fileno() if self.writer is not None else -1

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()

    # -- rotating --------------------------------------------------------------------------------------------
    def tick(self) -> bool:
        """-G: the next file when this interval is over; True once -W's last file is done (the capture ends,
        that file stays open for what is still to be drained)."""
        if self.done:
            return True
        self._check()
        now = int(time.time())
        if not self.plan.seconds or now - self.since < self.plan.seconds:
            return False
        self.intervals += 1
        if not self.plan.size and self.plan.files and self.intervals >= self.plan.files:
            self.done = True
            return True
        self.since = now
        self._next(0)
        return False

    def rotate(self) -> None:
        """-C: close the current file, open the next one (with -W: the oldest again after the last)."""
        count = self.count + 1
        self._next(0 if self.plan.files and count >= self.plan.files else count)

    def _check(self) -> None:
        if self.writer is None:   # the next file could not be opened: every write fails as that did
            e = self.error
            raise OSError(e.errno, e.strerror, e.filename)

    def _next(self, count: int) -> None:
        old, self.writer = self.writer, None
        try:
            old.close()
            self.count = count
            self._open()
        except OSError as e:
            self.error = e.with_traceback(None)
            raise

    def _open(self) -> None:
        chars = self.plan.chars if self.plan.size else 0
        self.path = file_name(self.template, self.count, chars, self.since)
        f = open(self.path, "wb", buffering=FILE_BUFFERING)  # noqa: SIM115 - the writer owns it
        try:
            writer = self._start(f)
            self.size = f.tell()
        except BaseException:
            f.close()
            raise
        self.writer = writer
        self.names[self.path] = None
        self.opened += 1
        self.fresh = True

    def _write(self, buffers: list) -> None:
        if buffers:
            self.writer.writev(buffers)
            self.size += sum(map(len, buffers))
            self.fresh = False


def _first_past(buffers: list, fmt: str, room: int, total: int) -> int | None:
    """The offset of the first record in the batch that starts more than `room` bytes in (before it, the file is
    already larger than the limit); None when none does or the lengths make no sense (then nothing is cut)."""
    at_len, extra, smallest = _LENGTH[fmt]
    unpack = _U32.unpack_from
    base = at = 0       # the batch offsets of buffers[i] and of the next record
    for i, b in enumerate(buffers):
        n = len(b)
        end = base + n
        while at < end:
            if at > room:
                return at
            off = at - base + at_len
            if off + 4 <= n:
                length = extra + unpack(b, off)[0]
            else:   # the length field straddles buffers (a ring's wrap, a block in parts)
                field = _read(buffers, i, off, 4)
                if field is None:
                    return None
                length = extra + _U32.unpack(field)[0]
            if length < smallest:
                return None
            at += length
        base = end
    return None


def _read(buffers: list, i: int, off: int, n: int) -> bytes | None:
    """n bytes at offset `off` of buffer i, running on into the buffers after it; None past the batch's end."""
    out = b""
    while len(out) < n and i < len(buffers):
        b = buffers[i]
        if off < len(b):
            out += bytes(b[off:off + n - len(out)])
            off = 0
        else:
            off -= len(b)
        i += 1
    return out if len(out) == n else None


def _cut(buffers: list, at: int, made: list) -> tuple[list, list]:
    """The batch's first `at` bytes and the rest, as two lists of buffers (views cut here are added to made)."""
    head: list = []
    pos = 0
    for j, b in enumerate(buffers):
        n = len(b)
        if pos + n <= at:
            head.append(b)
            pos += n
            continue
        rest = buffers[j + 1:]
        if at > pos:
            v = memoryview(b)
            made.append(v)
            left, right = v[:at - pos], v[at - pos:]
            made += [left, right]
            head.append(left)
            return head, [right] + rest
        return head, buffers[j:]
    return head, []
