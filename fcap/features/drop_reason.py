"""A drop point's records: why the kernel dropped the packet (the reason's name from this kernel's BTF) and where
(the freeing function from /proc/kallsyms), recorded by the programs and named by fcap.kernel.drops. Where the
programs write the file rings, they write the names too, as user space gives them (fcap.kernel.ringrec)."""

from __future__ import annotations

from fcap.features.unit import Annotator, PacketFeature, keyed_text

# What a drop point's comment adds after the metadata's: (text before, attribute, style); the reason and the location
# as names, ' reason=NO_SOCKET at=FUNC+0xOFF' (no reason where the kernel's drop point has none)
COMMENT = ((" reason=", "reason", "str"), (" at=", "location", "str"))


class DropNames(Annotator):
    """The reason and location of the records of drop points (has_reason: point id -> its records have a reason).
    Where the programs write the file rings (`given`: the session's map), each text made is given to them too, for
    good (a reason's and a location's names never change): they write it into the records of the same (reason,
    location) after it themselves."""

    def __init__(self, has_reason: dict, given=None):
        from fcap.kernel import drops
        self.has_reason = has_reason
        self.names = drops.Names()
        self.given = given
        self._keys: set = set()   # (the keys given)

    def text(self, rec) -> str:
        text = keyed_text(COMMENT, self.values(rec))
        if self.given is not None and rec.point in self.has_reason:
            self._give(rec, text)
        return text

    def _give(self, rec, text: str) -> None:
        from fcap.kernel.layout import DROP_TEXT, DROP_TEXT_KEY
        from fcap.kernel.ringrec import give
        key = DROP_TEXT_KEY.struct.pack(rec.reason, int(self.has_reason[rec.point]), rec.location)
        if key not in self._keys:   # (too long, or the map full: its packets go on through the perf buffer)
            self._keys.add(key)
            give(self.given, key, DROP_TEXT, text)

    def values(self, rec) -> dict:
        reason, location = self.drop(rec)
        return {"reason": reason, "location": location} if location is not None else {}

    def describe(self, rec) -> str | None:
        """'NO_SOCKET at FUNC+0xOFF' (as fcap path says it) for a record of a drop point, else None."""
        return self.names.describe(rec, self.has_reason[rec.point]) if rec.point in self.has_reason else None

    def drop(self, rec) -> tuple:
        """(reason name or None, location) of a record of a drop point; (None, None) elsewhere."""
        if rec.point not in self.has_reason:
            return None, None
        names = self.names
        return (names.reason(rec.reason) if self.has_reason[rec.point] else None), names.location(rec.location)


def drop_names(points, given=None) -> DropNames | None:
    """The names of a capture's drop records, None where no point is a drop point (`given`: the map the file rings'
    programs read them from)."""
    from fcap.kernel import drops
    has_reason = {p.id: drops.reason_arg(p) is not None for p in points if drops.is_drop_point(p)}
    return DropNames(has_reason, given) if has_reason else None


FEATURE = PacketFeature(
    "drop", comment=COMMENT, program=("drop reason",),
    annotator=lambda session: drop_names(session.points, session.drop_texts))
