"""Printed lines of a live capture a batch at a time (fcap.text.fastlines). Where the capture's records can be pcap
records (one point, nothing printed but each packet's line), the drains write them to a LinesWriter as they write a
file, at their speed on every path (the file rings, the perf buffer's arrays), and it prints them. Otherwise the
records the capture loop hands fcap.live.output.PrintSink one by one wait in Pending until the next poll (or a full
batch), and their lines are made at once."""

from __future__ import annotations

import struct
import sys

from fcap.defaults import NS
from fcap.live.drain import FAST

_ORDER = "<" if sys.byteorder == "little" else ">"   # (the drains' records: the machine's byte order)
_HEADER = struct.Struct(_ORDER + "IIII")
_CAPLEN = struct.Struct(_ORDER + "I")


class LinesWriter:
    """For the drains (fcap.live.drain), a capture file's writer (as fcap.files.pcapfile.PcapWriter: pcap records,
    nanosecond times, the machine's byte order) that prints the records' lines (a fcap.text.printer.Printer's)
    instead of writing them."""

    fmt = "pcap"

    def __init__(self, printer):
        self.printer = printer
        self.linktype = 1
        self.snaplen = 0

    def add_interface(self, name: str, linktype: int, snaplen: int, description: str = "") -> int:
        self.linktype, self.snaplen = linktype, snaplen
        return 0

    def writev(self, buffers: list) -> None:
        """Whole records, one after the other in the buffers."""
        data = b"".join(buffers)
        offsets, at, end, caplen = [], 0, len(data), _CAPLEN.unpack_from
        while at < end:
            offsets.append(at)
            at += 16 + caplen(data, at + 8)[0]
        self._print(data, offsets)

    def write_iov(self, iov) -> None:
        """Whole records in memory (fcap.files.iovec: address and length of each)."""
        from fcap.files import iovec
        sizes = [int(n) for n in iov[:, 1]]
        offsets, at = [], 0
        for n in sizes:
            offsets.append(at)
            at += n
        self._print(iovec.gather(iov), offsets)

    def _print(self, data: bytes, offsets) -> None:
        if not len(offsets):
            return
        printer = self.printer
        if FAST.wait() is None:   # (no numpy: the Printer's lines one by one)
            for at in offsets:
                sec, ns, caplen, length = _HEADER.unpack_from(data, at)
                printer.packet(sec * NS + ns, data[at + 16:at + 16 + caplen], self.linktype, length)
            return
        from fcap.files.batches import pcap_batch
        from fcap.text.fastlines import batch_text
        np = FAST.module.np
        batch = pcap_batch(data, np.asarray(offsets, np.int64), _ORDER, snaplen=self.snaplen, linktype=self.linktype)
        fields, b = batch.fields, batch.data

        def slow(i: int) -> str:
            a = int(fields["at"][i])
            return printer.text(int(fields["ts_ns"][i]), data[a:a + int(fields["caplen"][i])], self.linktype,
                                int(fields["len"][i]))

        printer.counted += len(fields)
        printer.write_batch(batch_text(printer.summarizer, fields, b, data, slow))

    def flush(self) -> None:
        self.printer.flush()

    def close(self) -> None:
        self.printer.flush()


class Pending:
    """A live capture's records waiting to be printed a batch at a time (fcap.live.output.PrintSink): each
    packet's time, bytes, original length and the text after its time (the point's name and what the features
    say), printed by text() as the Printer prints them one by one: with fcap.text.fastlines (numpy imported while
    the programs load: fcap.live.drain.FAST), else packet by packet."""

    def __init__(self, printer, linktype: int):
        self.printer, self.linktype = printer, linktype
        self.ts, self.data, self.lengths, self.points = [], [], [], []

    def __len__(self) -> int:
        return len(self.ts)

    def add(self, ts_ns: int, data: bytes, orig_len: int, point: str | None) -> None:
        self.ts.append(ts_ns)
        self.data.append(data)
        self.lengths.append(orig_len)
        self.points.append(point)

    def text(self) -> list | str:
        """The lines of the records added since the last call (as fcap.text.fastlines.batch_text gives them; str
        where numpy is not at hand)."""
        ts, datas, lengths, points = self.ts, self.data, self.lengths, self.points
        self.ts, self.data, self.lengths, self.points = [], [], [], []
        n = len(ts)
        printer, linktype = self.printer, self.linktype
        if not n or FAST.wait() is None:
            return "".join([printer.text(t, d, linktype, o, p) for t, d, o, p in zip(ts, datas, lengths, points)])
        from fcap.files.batches import FIELDS, decode
        from fcap.text.fastlines import batch_text
        np = FAST.module.np
        caplen = np.fromiter(map(len, datas), np.int64, n)
        fields = np.zeros(n, FIELDS)
        fields["ts_ns"], fields["caplen"], fields["len"], fields["linktype"] = ts, caplen, lengths, self.linktype
        fields["at"] = np.cumsum(caplen) - caplen
        data = b"".join(datas)
        b = np.frombuffer(data + bytes(64), np.uint8)
        decode(fields, b)

        def slow(i: int) -> str:
            return printer.text(ts[i], datas[i], linktype, lengths[i], points[i])

        named = None
        if any(points):
            named = np.array(["" if p is None else p.replace("%", "%%") + " " for p in points], object)
        return batch_text(printer.summarizer, fields, b, data + bytes(64), slow, points=named)
