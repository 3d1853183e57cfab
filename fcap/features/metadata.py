"""The packet's metadata (skb, pid, tid, comm, device, mark, netns, protocol, length: the record's fields with a
comment key, declared in fcap.kernel.record): the comment's first part, on every record that has a comment; the
programs write it (fcap.kernel.layout: META, COMMENT)."""

from __future__ import annotations

from fcap.features.unit import Annotator, PacketFeature
from fcap.kernel.layout import COMMENT, format_comment
from fcap.kernel.record import FIELDS

# the Packet attributes the comment shows (fcap.packet's from the record's fields with a key), in its order, taken by
# name from a capture's record or a file's comment
METADATA = tuple(a.name for f in FIELDS for a in f.attrs if a.packet and a.key)


class Metadata(Annotator):
    def text(self, rec) -> str:
        return format_comment(rec)

    def values(self, rec) -> dict:
        return {name: getattr(rec, name) for name in METADATA}

    def printed(self, rec) -> str:
        return ""   # (tcpdump's line says it already)


FEATURE = PacketFeature("metadata", comment=COMMENT, annotator=lambda session: Metadata())
