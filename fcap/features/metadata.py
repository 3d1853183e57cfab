"""The packet's metadata (skb, pid, tid, comm, device, mark, netns, protocol, length: the record's fields with a
comment key, declared in fcap.kernel.record): the comment's first part, on every record that has a comment; the
programs write it (fcap.kernel.layout: META, COMMENT)."""

from __future__ import annotations

from dataclasses import fields

from fcap.features.unit import Annotator, PacketFeature
from fcap.kernel.layout import COMMENT, format_comment
from fcap.packet import Packet

# the Packet attributes the comment shows, taken by name from a capture's record or a file's comment
METADATA = tuple(f.name for f in fields(Packet) if f.name in {attr for _pre, attr, _s in COMMENT})


class Metadata(Annotator):
    def text(self, rec) -> str:
        return format_comment(rec)

    def values(self, rec) -> dict:
        return {name: getattr(rec, name) for name in METADATA}

    def printed(self, rec) -> str:
        return ""   # (tcpdump's line says it already)


FEATURE = PacketFeature("metadata", comment=COMMENT, annotator=lambda session: Metadata())
