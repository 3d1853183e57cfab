"""A drop point's records: why the kernel dropped the packet (the reason's name from this kernel's BTF) and where
(the freeing function from /proc/kallsyms), recorded by the programs and named by fcap.kernel.drops."""

from __future__ import annotations

from fcap.features.unit import Annotator, PacketFeature, keyed_text

# What a drop point's comment adds after the metadata's: (text before, attribute, style); the reason and the location
# as names, ' reason=NO_SOCKET at=FUNC+0xOFF' (no reason where the kernel's drop point has none)
COMMENT = ((" reason=", "reason", "str"), (" at=", "location", "str"))


class DropNames(Annotator):
    """The reason and location of the records of drop points (has_reason: point id -> its records have a reason)."""

    def __init__(self, has_reason: dict):
        from fcap.kernel import drops
        self.has_reason = has_reason
        self.names = drops.Names()

    def text(self, rec) -> str:
        return keyed_text(COMMENT, self.values(rec))

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


def drop_names(points) -> DropNames | None:
    """The names of a capture's drop records, None where no point is a drop point."""
    from fcap.kernel import drops
    has_reason = {p.id: drops.reason_arg(p) is not None for p in points if drops.is_drop_point(p)}
    return DropNames(has_reason) if has_reason else None


def _at_drop_points(cfg, points) -> bool:
    from fcap.kernel.drops import is_drop_point
    return any(is_drop_point(p) for p in points)


FEATURE = PacketFeature(
    "drop", comment=COMMENT, program=("drop reason",),
    annotator=lambda session: drop_names(session.points),
    user_space=_at_drop_points)   # (names: user space's)
