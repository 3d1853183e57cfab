"""`fcap -r FILE`'s lines a batch at a time: a pcap or pcapng file walked by fcap.files.batches, each batch's lines
made by fcap.text.fastlines.batch_text; the packets it leaves (odd pcap times, the pcapng blocks from the first
with custom options on) printed by the Printer, as `fcap -r` prints packet by packet."""

from __future__ import annotations

from fcap.defaults import FILE_BATCH, NS
from fcap.live.fastmerge import items
from fcap.text.fastlines import batch_text


def print_pcap(path: str, printer, limit: int = 0) -> tuple[int, bool]:
    """Prints the packets of the pcap or pcapng file at `path` (up to `limit`; 0: all) as printer.packet() would, a
    batch at a time: (how many were printed, whether the file was read to its end or the limit). False where the
    batches stopped at damage, at a pcapng packet with custom options (fcap's --dump values, printed under its
    line by the per-record path), or where this is not a file fcap.files.batches walks (nothing printed then): the
    caller reads on record by record after the packets printed, and its reader names the damage as -r always
    did."""
    from fcap.errors import PcapFormatError
    from fcap.files import batches
    with open(path, "rb") as f:
        fmt = batches._format(f.read(24))
    if fmt is None:
        return 0, False
    printed = 0
    try:
        for batch in batches.batches(path, FILE_BATCH, decoded=False):
            fields = batch.fields if not limit else batch.fields[:limit - printed]
            whole = len(fields) if fmt != "pcapng" else batches.plain_epbs(fields, batch.data)
            fields = fields[:whole]
            printer.write_batch(_text(printer, fields, batch.data, fmt[:2] if fmt != "pcapng" else None))
            printed += whole
            if printed == limit:
                break
            if whole < len(batch.fields):
                return printed, False
    except PcapFormatError:
        return printed, False
    finally:
        printer.counted += printed
    return printed, True


def _text(printer, fields, b, pcap=None) -> str:
    """The lines of a batch; pcap: a pcap batch's (byte order, ns per fraction), whose records may hold an odd time
    (a fraction of a second or more, fcap.files.pcapread.FileRecord.stamp: those packets printed by the Printer with
    it); None for pcapng (times as the interfaces give them)."""
    data = b.base if isinstance(b.base, bytes) else b.tobytes()
    at, caplen, length, ts, linktype = fields["at"], fields["caplen"], fields["len"], fields["ts_ns"], \
        fields["linktype"]
    odd = secs = fracs = None
    per_second = 0
    if pcap is not None:
        order, scale = pcap
        per_second = NS // scale
        stamps = items(b, 8)[fields["at"] - 16].view(order + "u4").reshape(-1, 2)
        secs, fracs = stamps[:, 0], stamps[:, 1]
        odd = fracs >= per_second

    def slow(i: int) -> str:
        a = int(at[i])
        stamp = (int(secs[i]), int(fracs[i]), per_second) if odd is not None and odd[i] else None
        return printer.text(int(ts[i]), data[a:a + int(caplen[i])], int(linktype[i]), int(length[i]), stamp=stamp)

    return batch_text(printer.summarizer, fields, b, data, slow, odd)
