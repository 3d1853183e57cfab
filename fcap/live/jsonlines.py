"""Live --json's lines of the common records without a Packet: where a capture's records say nothing but their
metadata (no feature asked for, no verdict, Ethernet), the same text fcap.text.jsonout.packet_line writes of the
record's fcap.Packet (tests/test_json.py holds them to each other), made a batch at a time from the records the
perf buffer's drain hands over with their metadata (JsonWriter, with numpy) or, without numpy, one %-format a
record over its attributes and the headers' text (record_lines, fcap.text.dissect.common.ether_json); any other
record goes through the Packet."""

from __future__ import annotations

from operator import attrgetter

from fcap.features.metadata import METADATA, Metadata
from fcap.files import linktypes
from fcap.kernel.layout import COMMENT, META, META_SIZE, READ, parse_record
from fcap.live.drain import FAST, WITH_META
from fcap.text.dissect.common import ether_json
from fcap.text.jsonout import _ENCODER, _META, _front, packet_line

# how a metadata attribute is written: all numbers but the skb's address, a hex string (jq's doubles would round it)
_FORMS = {"skb": '"0x%016x"', "comm": "%s"}


def record_lines(sink) -> _Lines | None:
    """Its line(rec): the line of a record, or None where it needs the Packet; None where no record of this capture
    can do without (sink: an open JsonSink, its options the session's RecordNotes)."""
    notes = sink.options
    if sink.linktype != linktypes.EN10MB.number or [type(n) for n in notes.notes] != [Metadata]:
        return None
    if notes.decided or any(v is not None for v in notes.verdicts.values()):
        return None
    if any(style == "str" and attr != "comm" for _pre, attr, style in COMMENT if attr in METADATA):
        return None   # (a text attribute but comm: this writer writes numbers and comm)
    # the attributes PacketSink.packet gives besides the notes' (Metadata's alone here: the others are None, left out)
    shown = [name for name in _META if name in METADATA or name in ("point", "packet_id", "queue", "direction")]
    formats = {}
    for point, name in sink.names.items():
        for queued in (False, True):
            formats[point, queued] = _format(shown, _ENCODER.encode(name), sink.directions.get(point), queued)
    return _Lines(formats, [n for n in shown if n not in ("point", "direction")], sink.session.clock_offset_ns)


def _format(shown: list, point: str, direction: str | None, queued: bool) -> str:
    """The line's %-format up to the headers' text: ts_ns, then the shown attributes in _META's order."""
    out = ['{"ts_ns":%d']
    for name in shown:
        if name == "point":
            out.append(',"point":' + point.replace("%", "%%"))
        elif name == "direction":
            if direction is not None:
                out.append(f',"direction":"{direction}"')
        elif name == "queue":
            if queued:
                out.append(',"queue":%d')
        else:
            out.append(f',"{name}":' + _FORMS.get(name, "%d"))
    return "".join(out) + ',"len":%d,"caplen":%d,"linktype":1,%s}\n'


class _Lines:
    def __init__(self, formats: dict, values: list, offset_ns: int):
        self.formats, self.offset = formats, offset_ns
        self.comms: dict[str, str] = {}
        # the record's attributes in the formats' order (packet_id is the record's id; queue where it has one), and
        # where comm stands among them (written as JSON: the encoded text of each name, made once)
        names = ["id" if n == "packet_id" else n for n in values]
        self.get = {}
        for queued in (False, True):
            got = [n for n in names if queued or n != "queue"]
            self.get[queued] = (attrgetter(*got), got.index("comm"))

    def line(self, rec) -> str | None:
        data = rec.data
        text = ether_json(data, rec.orig_len)
        fmt = self.formats.get((rec.point, rec.queue is not None))
        if text is None or fmt is None:
            return None
        comm = self.comms.get(rec.comm)
        if comm is None:
            comm = self.comms[rec.comm] = _ENCODER.encode(rec.comm)
        get, at = self.get[rec.queue is not None]
        values = get(rec)
        return fmt % (rec.ts_ns + self.offset, *values[:at], comm, *values[at + 1:], rec.orig_len, len(data), text)


class JsonWriter:
    """For the perf buffer's drain (fcap.live.drain.FileDrain), a writer that takes the records with their metadata
    (WITH_META: each one's META, then its bytes) and writes their --json lines a batch at a time: each line's text
    before its headers is one %-format per distinct metadata, made from the Packet of its first record by jsonout's
    own code (its time, packet id, skb address and lengths left to each record, read from META as columns by name);
    the headers' text as -r --json's (fcap.text.fastjson.batch_json); a record batch_json does not lay out is
    jsonout's line of its Packet (sink.packet). For the captures record_lines() takes, with numpy."""

    fmt = WITH_META

    def __init__(self, sink):
        self.sink, self.out, self.flush_each = sink, sink.out, sink.line_buffered
        self.offset = sink.session.clock_offset_ns
        self.heads: dict[bytes, str] = {}   # a metadata key's %-format up to the headers

    def writev(self, buffers: list) -> None:
        """Records, one a buffer (the drain's Python walk)."""
        starts, at = [], 0
        for b in buffers:
            starts.append(at)
            at += len(b)
        self.write_records(b"".join(buffers), starts)

    def write_records(self, data, starts) -> None:
        """Records one after the other in `data`, each starting at its `starts`."""
        from fcap.text.printer import write_lines
        write_lines(self.out, self.text(data, starts))
        if self.flush_each:
            self.out.flush()

    def text(self, data: bytes, starts) -> list:
        """The lines of the records starting at `starts` in `data` (fcap.text.printer.formatted_rows' pieces)."""
        from fcap.files.batches import FIELDS
        from fcap.text.fastjson import batch_json
        np = FAST.module.np
        starts = np.asarray(starts, np.int64)
        n = len(starts)
        padded = b"".join((data, bytes(_PAD)))
        b = np.frombuffer(padded, np.uint8)
        fields = np.zeros(n, FIELDS)
        ts = _column(np, b, starts, "ts").astype(np.int64) + self.offset   # (the wall clock's)
        fields["ts_ns"], fields["at"], fields["linktype"] = ts, starts + META_SIZE, linktypes.EN10MB.number
        fields["caplen"], fields["len"] = _column(np, b, starts, "caplen"), _column(np, b, starts, "orig")

        def record(i: int):
            s = int(starts[i])
            return parse_record(padded[s:s + META_SIZE + int(fields["caplen"][i])])

        def slow(i: int) -> str:
            return packet_line(self.sink.packet(record(i)))

        front = np.column_stack((ts.astype(np.uint64), _column(np, b, starts, "id"), _column(np, b, starts, "skb"),
                                 fields["len"].astype(np.uint64), fields["caplen"].astype(np.uint64)))
        return batch_json(fields, b, padded, slow, (self._heads(np, b, starts, record), front, np.ones((n, 5), bool)))

    def _heads(self, np, b, starts, record):
        """Each row's %-format up to its headers: one per distinct metadata but the time, packet id, skb address and
        lengths (the fields _KEYED)."""
        from fcap.text.fastflows import ids
        keys = np.column_stack([_column(np, b, starts, f) if META.width(f) <= 8 else
                                _items_of(np, b, starts, f) for f in _KEYED])
        number, first = ids(keys)
        made = []
        if len(self.heads) > _HEADS_MAX:
            self.heads.clear()
        for row in first.tolist():
            key = keys[row].tobytes()
            head = self.heads.get(key)
            if head is None:
                head = self.heads[key] = _head(self.sink.packet(record(row)))
            made.append(head)
        return np.array(made, object)[number]


def _head(p) -> str:
    """The %-format of a Packet's line up to its headers (ending in '"linktype":1,'): jsonout's text of it, but
    for the values each record has its own (%d or %x: time, packet id, skb address, lengths)."""
    out = []
    for key, value in _front(p).items():
        text = _OWN.get(key)
        out.append(f'"{key}":' + (text if text is not None else _ENCODER.encode(value).replace("%", "%%")))
    return "{" + ",".join(out) + ","


# the values of a line each record has its own (JsonWriter.text's front columns, in this order: _front's)
_OWN = {"ts_ns": "%d", "packet_id": "%d", "skb": '"0x%016x"', "len": "%d", "caplen": "%d"}
assert [k for k in _META if k in _OWN] == ["packet_id", "skb"], "JsonWriter's columns: in _front's order"


def _column(np, b, starts, name: str):
    """META's field `name` of each record (starting at `starts` in b), as unsigned 64-bit integers."""
    from fcap.live.fastmerge import items
    off, width = META.off(name), META.width(name)
    return items(b, width)[starts + off].view(f"<u{width}").astype(np.uint64)


def _items_of(np, b, starts, name: str):
    """A wider field of META (comm) as columns of 8 bytes."""
    from fcap.live.fastmerge import items
    return items(b, META.width(name))[starts + META.off(name)].view(np.uint64).reshape(len(starts), -1)


# META's fields a line's text up to its headers depends on, besides those _OWN's values are read from: the point
# (its name and direction), the flags (whether it has a queue), the queue and the metadata the Packet shows
_KEYED = tuple(dict.fromkeys(["point", "flags", "queue"] + [READ[a][0] for a in METADATA if a != "skb"]))
_HEADS_MAX = 4096   # distinct metadata remembered (past it, forgotten)
_PAD = 128   # zero bytes after a batch's records (as fcap.files.batches pads its batches: header reads stay in bounds)
