"""At a BPF program's exit (xdp/PROG:exit, tc/PROG:exit): the verdict the program returned, recorded by the capture
program (fcap.kernel.verdicts) and named (XDP_DROP, TC_ACT_SHOT) in the comment and the printed line; epb_verdict
carries its number (fcap.features.notes)."""

from __future__ import annotations

from fcap.features.unit import Annotator, PacketFeature, keyed_text

# What the comment adds at a BPF program's exit: the verdict's name (' verdict=XDP_DROP')
COMMENT = ((" verdict=", "verdict_name", "str"),)


class VerdictNames(Annotator):
    """The verdict's name of the records of BPF programs' exits (decided: point id -> its Point)."""

    def __init__(self, decided: dict):
        from fcap.kernel import verdicts
        self.decided, self.name = decided, verdicts.name

    def text(self, rec) -> str:
        p = self.decided.get(rec.point)
        return keyed_text(COMMENT, {"verdict_name": self.name(p, rec.retval)}) if p is not None else ""


def decided(points) -> dict:
    """{point id: point} of the points whose records carry their program's own verdict (BPF programs' exits)."""
    from fcap.kernel import verdicts
    return {p.id: p for p in points if verdicts.records_verdict(p)}


def _annotator(session) -> VerdictNames | None:
    found = decided(session.points)
    return VerdictNames(found) if found else None


FEATURE = PacketFeature("verdict", comment=COMMENT, program=("verdict",),
                        annotator=_annotator)
