"""Where a capture's records go, behind one interface (Sink): a capture file (-w FILE, -w - on stdout, -C/-G/-W's
series of files), printed lines, --json's lines, --path's paths, the API's Packets. The command line, the API and
extcap (which captures through the command line into Wireshark's FIFO) all open theirs with start(): the output
opened (the file's header and interface description blocks), then the programs attached, and a file that a failed
attach leaves behind removed. Records reach a sink in time order: the capture loop feeds it through the session's
ordered drain (fcap.live.order), or a file sink's writer takes finished records straight from fcap.live.drain."""

from __future__ import annotations

import functools
import os
import sys
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

from fcap.defaults import FILE_BUFFERING
from fcap.errors import CaptureError, FcapError

if TYPE_CHECKING:
    from fcap.packet import Packet

PCAP, PCAPNG = "pcap", "pcapng"


class Sink(ABC):
    """One output of a capture. open(session) before the programs are attached; write(rec) for each record (in time
    order; an OSError of one of `failures` ends the capture, others are bugs and propagate); poll() at each poll of
    the buffers; command_started(pid) when the command after -- runs; stats(session) once the capture ended well;
    close(ok), where ok=False means the capture never started and whatever it made is discarded."""

    writer = None        # a capture-file writer the drains (fcap.live.drain) write finished records to, or None
    stream = False       # packets go to stdout as a capture file (a command's own output must not land there)
    pipe = False         # a reader that left (EPIPE) ends the capture quietly, as tcpdump's
    failures: tuple = (OSError,)   # what write() may raise that ends the capture with a line
    path = ""            # what the user named, for error lines

    def open(self, session) -> None:
        """Take the session's points (and, for a file, write its header and interfaces)."""
        from fcap.features.notes import RecordNotes
        self.session = session
        self.options = RecordNotes(session)   # (pcapng options; what the features say of each record)

    @abstractmethod
    def write(self, rec) -> None:
        """One record (fcap.kernel.layout.Record), its timestamp still the session's monotonic one."""

    def poll(self) -> bool:
        """Called at each poll: True ends the capture (-G -W: the last file is done). OSError: the output failed
        (BrokenPipeError: its reader left)."""
        return False

    def command_started(self, pid: int) -> None:
        """The command after -- runs as process `pid` (started after the programs were attached)."""

    def stats(self, session) -> None:
        """The capture ended without a write error: its counts, where the output keeps them."""

    def close(self, ok: bool = True) -> None:
        """Flush and close; ok=False: the capture never started, discard what was made."""

    def error_path(self) -> str:
        """The file an error line names."""
        return self.path


class FileSink(Sink):
    """A capture file in `fmt` (pcap or pcapng): at `path`, on stdout when path is None or "-", or a series of files
    when `rotation` (a fcap.files.rotate.RotationPlan) asks for one. Each file starts with its header and one interface
    description per point (pcap: the first point's only). `secrets`: where TLS secrets come from (pcapng, one file,
    no series: see SecretsFirst), each started before the file is opened and closed with it."""

    def __init__(self, path: str | None, fmt: str, rotation=None, secrets: tuple = ()):
        self.fmt = fmt
        self.rotation = rotation
        self.secrets = tuple(secrets)   # fcap.host.keylog.KeyLog (--tls-keylog), fcap.host.gotls.GoSecrets
        self.stream = path is None or path == "-"
        self.target = path
        self.path = "stdout" if self.stream else path
        self.clock = None

    def open(self, session) -> None:
        super().open(session)
        if self.rotation is not None:
            from fcap.files.rotate import RotatingWriter
            self.writer = RotatingWriter(self.target, self.rotation, self.fmt, self._start)
            self.path = self.writer.path
            self.clock = self.writer.tick if self.rotation.seconds else None
            return
        try:   # (the secrets' sources first: a uprobe attached before the command runs; all closed if one fails)
            for source in self.secrets:
                source.start()
            if self.stream:
                f = os.fdopen(os.dup(sys.stdout.fileno()), "wb", buffering=1 << 16)
            else:
                f = open(self.target, "wb", buffering=FILE_BUFFERING)  # noqa: SIM115 - the writer owns it
            self.writer = self._start(f)
        except BaseException:
            self._close_secrets()
            raise
        if self.secrets:
            self.writer = SecretsFirst(self.writer, self.secrets)

    def _close_secrets(self) -> None:
        for source in self.secrets:
            source.close()

    def command_started(self, pid: int) -> None:
        for source in self.secrets:
            source.follow(pid)

    def _start(self, f):
        """A capture file's writer on f, its header and interfaces written (each rotated file has them)."""
        from fcap.files.pcapfile import open_writer
        session = self.session
        writer = open_writer(f, self.fmt)
        lt = session.linktype
        for p in session.points:
            if self.fmt == PCAP and p.id > 0:
                break
            writer.add_interface(p.if_name, lt.number, session.cfg.snaplen, description=p.if_description())
        return writer

    def write(self, rec) -> None:
        """One record's block laid out here (a file's records go through the session's file drain instead)."""
        self.writer.write(rec.ts_ns + self.session.clock_offset_ns, rec.data, rec.orig_len, iface=rec.point,
                          **self.options.block(rec))

    @property
    def pipe(self) -> bool:
        return self.stream

    def poll(self) -> bool:
        if self.secrets:   # (also between writes: a source's buffer must not fill while no packet is written)
            self.writer.write_secrets()
        if self.stream:
            self.writer.flush()
            if reader_gone(self.writer.fileno()):   # (ssh, sshdump, an extcap FIFO: before the next packet)
                raise BrokenPipeError(32, "Broken pipe")
        return self.clock is not None and self.clock()

    def stats(self, session) -> None:
        """A pcapng file ends with each point's counts (Interface Statistics Blocks). Not a series of -C/-G files:
        the counts are the whole capture's, no one file's."""
        if self.fmt != PCAPNG or self.rotation is not None or not session.point_stats:
            return
        from fcap.kernel import stats
        stats.write_isbs(self.writer, session.point_stats, session.attached_ns,
                         session.detached_ns or session.attached_ns, session.window.disorder())

    def close(self, ok: bool = True) -> None:
        self._close_secrets()
        if ok:
            if self.writer is not None:
                self.writer.close()
            return
        try:   # a capture that never started: no file is left behind
            if self.writer is not None:
                self.writer.close()
            if not self.stream:
                os.unlink(self.path)
        except OSError:
            pass

    def error_path(self) -> str:
        return getattr(self.writer, "path", "") or self.path   # (a rotating writer: the file at fault)

    def fileno(self) -> int:
        """The file's descriptor, to hand to -Z's user (-1: stdout's is not ours to give)."""
        return -1 if self.stream or self.writer is None else self.writer.fileno()


class SecretsFirst:
    """A pcapng writer that writes the new secrets of its sources (key log lines, in one Decryption Secrets Block)
    before each write of records: a secret logged before a packet was captured is in the file before that packet,
    whichever drain writes it (fcap.live.drain's, or FileSink.write). Everything else is the writer's. A source has
    start() (before the capture), new() (its key log lines since the last call, b"" when none), follow(pid) (the
    command after -- runs as pid) and close()."""

    def __init__(self, writer, sources):
        self._writer, self._sources = writer, tuple(sources)

    def __getattr__(self, name: str):
        return getattr(self._writer, name)

    def write_secrets(self) -> None:
        """The sources' new secrets written now, in one block (none new: nothing written)."""
        data = b"".join(source.new() for source in self._sources)
        if data:
            self._writer.write_dsb(data)

    def write(self, *args, **kw) -> int:
        self.write_secrets()
        return self._writer.write(*args, **kw)

    def writev(self, buffers: list) -> None:
        self.write_secrets()
        self._writer.writev(buffers)

    def write_iov(self, iov) -> None:
        self.write_secrets()
        self._writer.write_iov(iov)


class PrintSink(Sink):
    """Printed lines, tcpdump's (a fcap.text.printer.Printer): each record's, with its dumps; several points: the
    point's name on each line, --context's cgroup and names, a drop point's reason and location and a BPF program's
    verdict after it."""

    pipe = True
    failures = (BrokenPipeError,)

    def __init__(self, printer, stacks: bool = False, lines: bool = False):
        self.printer = printer
        self.stacks = stacks   # -r: the stacks a file's comments carry printed (live: --stack's unit prints them)
        self.lines = lines     # the drains lay the records out as a pcap file's, printed by a LinesWriter

    def open(self, session) -> None:
        super().open(session)
        points = session.points
        self.names = {p.id: p.alias or p.spec for p in points} if len(points) > 1 else {}
        self.pending = None
        if self.lines:
            from fcap.live.printbatch import LinesWriter
            self.writer = LinesWriter(self.printer)
            self.writer.add_interface(points[0].if_name, session.linktype.number, session.cfg.snaplen)
        else:
            self.pending = _pending(self.printer, self.options, session.linktype.number)

    def write(self, rec) -> None:
        session = self.session
        name = self.names.get(rec.point)
        why = self.options.printed(rec)
        if why:   # the point's name, then what the features say (--context's names, a drop's reason and location,
            # --nft's rule, a BPF program's verdict)
            name = f"{name or session.points[0].if_name} [{why}]"
        if self.pending is not None:   # (printed at the next poll, or when a batch is full)
            self.pending.add(rec.ts_ns + session.clock_offset_ns, rec.data, rec.orig_len, name)
            if len(self.pending) >= _BATCH:
                self.printer.write_batch(self.pending.text())
            return
        self.printer.packet(rec.ts_ns + session.clock_offset_ns, rec.data, session.linktype.number, rec.orig_len,
                            name)
        self.options.below(self.printer, rec)   # (--dump's values, --stack's frames)

    def poll(self) -> bool:
        if self.pending:
            self.printer.write_batch(self.pending.text())
        return False

    def replay(self, rec) -> None:
        """-r FILE: a record read from a file (fcap.files.pcapread.FileRecord) printed as tcpdump -r prints it,
        its dumps and (with stacks) its stack under it."""
        p = file_packet(rec) if rec.custom or self.stacks else None
        self.printer.packet(rec.ts_ns, rec.data, rec.linktype, rec.orig_len, stamp=rec.stamp)
        if p is not None and p.dumps:
            self.printer.dumps(p.dumps.values())
        if self.stacks and p.stack is not None:
            self.printer.stack(p.stack)

    def close(self, ok: bool = True) -> None:
        if getattr(self, "pending", None):
            self.printer.write_batch(self.pending.text())
        self.printer.flush()


_BATCH = 4096   # live records printed a batch at a time at most (more wait for the next poll)


def _pending(printer, options, linktype: int):
    """Where a live capture's records wait to be printed a batch at a time (fcap.live.printbatch.Pending): where
    each is one line (Printer.lines_only) with nothing under it; else None."""
    from fcap.features.unit import Annotator
    if not printer.lines_only() or any(type(n).below is not Annotator.below for n in options.notes):
        return None
    from fcap.live.drain import FAST
    from fcap.live.printbatch import Pending
    FAST.load()   # (numpy, while the programs load)
    return Pending(printer, linktype)


class MirrorSink(Sink):
    """--mirror NAME: each record's packet sent on fcap's mirror interface (fcap.host.mirror), where tcpdump -i NAME
    and any libpcap program capture it."""

    def __init__(self, mirror):
        self.mirror = mirror
        self.path = mirror.name

    def write(self, rec) -> None:
        self.mirror.send(rec.data)

    def poll(self) -> bool:
        self.mirror.drain()
        return False

    def close(self, ok: bool = True) -> None:
        self.mirror.close()


class PacketSink(Sink):
    """Records as fcap.Packets (wall-clock time, the point's pcapng interface name, metadata, dumps, drop reason and
    location, direction, queue): the base of the outputs that hand out or print Packets (the API's, --json)."""

    def open(self, session) -> None:
        super().open(session)
        self.new = _packet()[0]
        self.names = {p.id: p.if_name for p in session.points}   # as the command line's files name them
        self.directions = {p.id: p.direction for p in session.points}
        self.linktype = session.linktype.number

    def packet(self, r) -> Packet:
        opts = self.options(r)
        return self.new(ts_ns=r.ts_ns + self.session.clock_offset_ns, point=self.names.get(r.point), data=r.data,
                      orig_len=r.orig_len, linktype=self.linktype,
                      packet_id=opts["packet_id"], verdict=opts["verdict"], comment=opts["comment"],
                      direction=self.directions.get(r.point), queue=r.queue, **self.options.values(r))


def file_packet(rec) -> Packet:
    """A record read from a file (fcap.files.pcapread.FileRecord) as a Packet: the features' attributes from fcap's
    comment when first asked for (fcap.read decodes on demand: iterating costs no parse), the dumps from its custom
    options, direction and queue from epb_flags and epb_queue."""
    if rec.comment is None and not rec.custom and not rec.flags and \
            all(v is None for v in (rec.iface_name, rec.packet_id, rec.verdict, rec.queue)):   # (a pcap file's)
        cls = _pcap_packet()
        p = cls.__new__(cls)
        p.__dict__.update(ts_ns=rec.ts_ns, data=rec.data, orig_len=rec.orig_len, linktype=rec.linktype, dumps={})
        return p
    cls, blank, none = _file_packet()
    p = cls.__new__(cls)
    d = p.__dict__
    d.update(blank)
    d.update(ts_ns=rec.ts_ns, point=rec.iface_name, data=rec.data, orig_len=rec.orig_len, linktype=rec.linktype,
             packet_id=rec.packet_id, verdict=rec.verdict, comment=rec.comment,
             direction=_DIRECTIONS.get((rec.flags or 0) & 3), queue=rec.queue)
    if rec.comment is None:   # (nothing to decode: pcap files)
        d.update(none)
        d["skb"] = rec.packet_id
    if rec.custom:
        from fcap.kernel.dumps import dumps_of
        d["dumps"] = {x.path: x for x in dumps_of(rec.custom, (rec.comment or "").split("\n"))}
    else:
        d["dumps"] = {}
    return p


def batch_packets(batch):
    """The Packets of a batch of a pcap file (fcap.files.batches.Batch), the same file_packet() makes of its records
    (a pcap file has no metadata: nothing to decode), made with as little work per packet as there can be."""
    cls = _pcap_packet()
    f = batch.fields
    data = batch.data.base if isinstance(batch.data.base, bytes) else batch.data.tobytes()
    new = cls.__new__
    for ts, at, caplen, length, lt in zip(f["ts_ns"].tolist(), f["at"].tolist(), f["caplen"].tolist(),
                                          f["len"].tolist(), f["linktype"].tolist()):
        p = new(cls)
        d = p.__dict__
        d["ts_ns"], d["data"], d["orig_len"], d["linktype"], d["dumps"] = ts, data[at:at + caplen], length, lt, {}
        yield p


class _FromComment:
    """A file Packet's attribute taken from fcap's comment on first use: the comment parsed once, every such
    attribute stored on the packet (its own value then hides this descriptor)."""

    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name

    def __get__(self, obj, owner=None):
        if obj is None:
            return None
        comments, unset = _comment_reader()
        d = obj.__dict__
        meta = comments.of_text(d["comment"])
        d.update(unset)
        for attr, value in meta.items():
            if attr in unset:
                d[attr] = value
        d["skb"] = meta.get("skb", d["packet_id"])
        return d[self.name]


@functools.cache
def _comment_reader() -> tuple:
    """fcap.features.comments (its of_text reads a comment), and the comment's Packet attributes as None (those a
    comment lacks)."""
    from fcap.features import comments
    return comments, dict.fromkeys(_from_comment())


@functools.cache
def _packet() -> tuple:
    """fcap.Packet and its attributes' (name, default), imported on first use (the printed lines of `fcap -r` need
    neither it nor the dataclass machinery: their start-up)."""
    from dataclasses import fields
    from fcap.packet import Packet
    return Packet, tuple((f.name, f.default) for f in fields(Packet))


@functools.cache
def _file_packet() -> tuple:
    """The Packet class of a file's packets (the comment's attributes decoded on demand), the attributes neither
    the record nor the comment gives, as Packet's defaults, and the comment's attributes where there is none."""
    lazy = set(_from_comment()) | {"skb"}
    Packet, attrs = _packet()
    cls = type("Packet", (Packet,), {"__doc__": Packet.__doc__, "__module__": Packet.__module__,
                                     "__reduce__": _as_packet, "__eq__": _equal, "__hash__": None,
                                     **{a: _FromComment(a) for a in lazy}})
    given = {"ts_ns", "point", "data", "orig_len", "linktype", "packet_id", "verdict", "comment", "direction",
             "queue", "dumps"}
    blank = {name: default for name, default in attrs if name not in lazy | given}
    return cls, blank, dict.fromkeys(lazy)


@functools.cache
def _pcap_packet() -> type:
    """The Packet class of a pcap file's packets: every attribute but the record's own is its default, the
    dataclass's on the class (no comment to decode; a pcap file has no points): a Packet is made with four
    attributes and its dumps' dictionary."""
    Packet, _attrs = _packet()
    return type("Packet", (Packet,), {"__doc__": Packet.__doc__, "__module__": Packet.__module__,
                                      "__reduce__": _as_packet, "__eq__": _equal, "__hash__": None, "point": None})


def _as_packet(p) -> tuple:
    """A file Packet pickled (or copied) as the Packet it stands for."""
    return _packet()[0], _values(p)


def _equal(p, other):
    """A file Packet equals any Packet with the same attributes, as Packets do."""
    return _values(p) == _values(other) if isinstance(other, _packet()[0]) else NotImplemented


def _values(p) -> tuple:
    return tuple(getattr(p, name) for name, _default in _packet()[1])


@functools.cache
def _from_comment() -> tuple:
    """The Packet attributes a file's comment gives back (every feature's keys that are Packet attributes)."""
    from fcap.features.comments import KEYS
    attrs = {name for name, _default in _packet()[1]}
    return tuple(attr for _pre, attr, _s in KEYS if attr in attrs)


_DIRECTIONS = {1: "in", 2: "out"}   # epb_flags' direction bits (0: not known)


class JsonSink(PacketSink):
    """--json: each record one line of JSON on `out` (fcap.text.jsonout, the encoder -r --json uses too), flushed per
    packet with -l; a reader that left ends the capture quietly, as printed lines'."""

    pipe = True
    failures = (BrokenPipeError,)

    def __init__(self, out, line_buffered: bool = False):
        self.out = out
        self.line_buffered = line_buffered
        self.path = "stdout"
        self.lines: list[str] = []   # (written at the next poll, or when _BATCH wait: one write, not one a line)

    def open(self, session) -> None:
        super().open(session)
        from fcap.live.drain import FAST
        from fcap.live.jsonlines import JsonWriter, record_lines
        lines = record_lines(self)   # (the common records' lines without a Packet, where this capture has them)
        self.fast = lines.line if lines is not None else None
        if lines is not None and FAST.wait() is not None:   # (a batch at a time: from the records with their META)
            self.writer = JsonWriter(self)

    def write(self, rec) -> None:
        line = self.fast(rec) if self.fast is not None else None
        if line is None:
            from fcap.text.jsonout import packet_line
            line = packet_line(self.packet(rec))
        if self.line_buffered:
            self.out.write(line)
            self.out.flush()
            return
        self.lines.append(line)
        if len(self.lines) >= _BATCH:
            self._write_lines()

    def poll(self) -> bool:
        if self.lines:
            self._write_lines()
        return False

    def _write_lines(self) -> None:
        text = "".join(self.lines)
        self.lines.clear()
        self.out.write(text)

    def replay(self, rec) -> None:
        """-r FILE --json: a record read from a file, as its fcap.Packet (as fcap.read gives it)."""
        self.out.write(self.file_line(rec))
        if self.line_buffered:
            self.out.flush()

    @staticmethod
    def file_line(rec) -> str:
        """The line of a record read from a file (fcap.files.pcapread.FileRecord)."""
        from fcap.text.jsonout import packet_line
        return packet_line(file_packet(rec))

    def close(self, ok: bool = True) -> None:
        if self.lines:
            self._write_lines()
        self.out.flush()


def file_format(path: str | None, fmt: str | None, to_stdout: bool, points: int) -> str | None:
    """The capture file's format (pcap or pcapng) for -w `path` and --format `fmt`, or None when packets are
    printed: stdout (no -w, not a terminal) is pcapng; a file's extension decides; several points need pcapng
    unless --format says pcap."""
    from fcap.files.pcapfile import format_for_path
    if path is None and not to_stdout:
        return None
    chosen = fmt or (PCAPNG if to_stdout else format_for_path(path))
    if points > 1 and chosen == PCAP and fmt is None:
        chosen = PCAPNG
    return chosen


def check_rotation_dir(path: str, rotation, user) -> None:
    """-Z with -C/-G: the files after the first are made as USER (as tcpdump makes them): say so now when USER
    cannot make files there."""
    import time

    from fcap.files.rotate import file_name
    from fcap.live import privileges
    first = file_name(path, 0, 0, int(time.time()) if rotation.seconds else None)
    directory = os.path.dirname(first) or "."
    if not privileges.may_create_in(directory, user):
        raise FcapError(f"-Z {user.pw_name}: cannot create files in {directory} (-C/-G make their files as "
                        f"{user.pw_name})")


def start(session, sink: Sink, user=None) -> Sink:
    """Open the sink, attach the session's (loaded) programs and (-Z) become `user`, the output file first handed
    to them. A failed attach closes the sink and removes its file: a capture that never started leaves none."""
    sink.open(session)
    try:
        session.attach()
    except CaptureError:
        sink.close(ok=False)
        raise
    if user is not None:
        _become(user, sink)
    return sink


def _become(user, sink: Sink) -> None:
    """-Z: the output is USER's, then the process is (an OSError is reported as the capture's error)."""
    from fcap.live import privileges
    try:
        fd = sink.fileno() if isinstance(sink, FileSink) else -1
        if fd >= 0:
            privileges.give_output(fd, user)
        privileges.drop_to(user)
    except OSError as e:
        raise FcapError(f"-Z {user.pw_name}: {e.strerror}") from None


def reader_gone(fd: int) -> bool:
    """The reading end of the pipe, socket or FIFO on fd was closed (poll reports POLLERR/POLLHUP: they are
    always reported, whatever the events asked); False for files and terminals."""
    if fd < 0:
        return False
    import select
    p = select.poll()
    p.register(fd, 0)
    return any(ev & (select.POLLERR | select.POLLHUP) for _fd, ev in p.poll(0))
