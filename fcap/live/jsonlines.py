"""Live --json's lines of the common records without a Packet: where a capture's records say nothing but their
metadata (no feature asked for, no verdict, Ethernet), each line is one %-format over the record's attributes and
the headers' text (fcap.text.dissect.common.ether_json), the same text fcap.text.jsonout.packet_line writes of the
record's fcap.Packet (tests/test_json.py holds the two to each other); any other record goes through the Packet."""

from __future__ import annotations

from operator import attrgetter
from typing import Callable

from fcap.features.metadata import METADATA, Metadata
from fcap.files import linktypes
from fcap.kernel.layout import COMMENT
from fcap.text.dissect.common import ether_json
from fcap.text.jsonout import _ENCODER, _META

# how a metadata attribute is written: all numbers but the skb's address, a hex string (jq's doubles would round it)
_FORMS = {"skb": '"0x%016x"', "comm": "%s"}


def record_lines(sink) -> Callable | None:
    """rec -> its line, or None where it needs the Packet; None where no record of this capture can do without
    (sink: an open JsonSink, its options the session's RecordNotes)."""
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
    return _Lines(formats, [n for n in shown if n not in ("point", "direction")], sink.session.clock_offset_ns).line


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
