"""What user space says of each record of a capture, from the features (fcap.features.FEATURES): the options of a
pcapng block it lays out (the same as the capture program writes into the file rings: fcap.kernel.ringrec), the
words between a printed line's brackets, the lines under it, and a Packet's attributes."""

from __future__ import annotations

from fcap.features import FEATURES
from fcap.features.prog_verdict import decided
from fcap.features.unit import Annotator
from fcap.kernel import verdicts
from fcap.kernel.epbopts import verdict
from fcap.kernel.layout import EPB_DIRECTION


class RecordNotes:
    """Made once per output (session: the capture, its points resolved). Called with a record: its block's options
    (keyword arguments of PcapngWriter.write and epb_parts): direction, comment (None with --no-comment), packet
    id, queue, verdict."""

    def __init__(self, session):
        points = session.points
        self.notes = [a for a in (f.annotator(session) for f in FEATURES if f.annotator) if a is not None]
        self.optioned = [n for n in self.notes if type(n).options is not Annotator.options]   # (those with options)
        self.comment = session.cfg.comment                 # (--no-comment: records without one)
        self.flags = {p.id: EPB_DIRECTION.get(p.direction) for p in points}
        self.verdicts = {p.id: verdict(p) for p in points}
        self.decided = decided(points)   # each record's own verdict

    def __call__(self, rec) -> dict:
        comment = "".join([n.text(rec) for n in self.notes]) if self.comment else None
        return {"flags": self.flags.get(rec.point), "comment": comment,
                "packet_id": rec.id, "queue": rec.queue, "verdict": self.verdict(rec)}

    def verdict(self, rec) -> tuple | None:
        """epb_verdict (type, value) of a record: the program's return value at a BPF program's exit, the drop
        points' constant, else None."""
        p = self.decided.get(rec.point)
        return (verdicts.verdict_type(p), rec.retval) if p is not None else self.verdicts.get(rec.point)

    def printed(self, rec) -> str:
        """The words the features put between a printed line's brackets ('' for none)."""
        return "".join([n.printed(rec) for n in self.notes]).strip()

    def below(self, printer, rec) -> None:
        """The lines the features print under a packet's."""
        for n in self.notes:
            n.below(printer, rec)

    def block(self, rec) -> dict:
        """All of a record's block options: __call__'s and more()'s, where user space lays out the block (a file
        drain's cache of blocks, fcap.live.drain; each block, fcap.live.output.FileSink)."""
        return {**self(rec), **self.more(rec)} if self.optioned else self(rec)

    def more(self, rec) -> dict:
        """The further pcapng options the features add to a record's block (PcapngWriter.write's comments and more:
        --dump's)."""
        out: dict = {}
        for n in self.optioned:
            out.update(n.options(rec))
        return out

    def values(self, rec) -> dict:
        """The features' Packet attributes of a record."""
        out: dict = {}
        for n in self.notes:
            out.update(n.values(rec))
        return out
