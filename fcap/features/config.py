"""The one way the flagged features (fcap.features.FLAGGED) become a capture's Config and are refused: the command
line's flags (fcap.commands.capture) and the API's keywords (fcap.api) go through here."""

from __future__ import annotations

from typing import Callable

from fcap.features import FLAGGED
from fcap.kernel.layout import RECORD_PCAP


def keywords() -> set:
    """The Config fields (and API keywords) the flagged features and their settings own."""
    return {n for f in FLAGGED for n in [f.name] + [s.name for s in f.settings]}


def asked(said: Callable[[str], object]) -> dict:
    """{Config field: value} of every flagged feature (on or off) and its settings (a tuple of values), `said(name)`
    what the flag or keyword of that name said."""
    out: dict = {}
    for f in FLAGGED:
        out[f.name] = bool(said(f.name))
        for s in f.settings:
            value = said(s.name) or ()
            out[s.name] = (value,) if isinstance(value, str) else tuple(value)
    return out


def refusal(cfg, points, fmt: str | None = None) -> str:
    """Why the features `cfg` asks for cannot be had at these points (fcap.points.spec.Point) written as `fmt`
    (pcap, pcapng, None: no file), as one line; "" when they can."""
    for f in FLAGGED:
        for s in f.settings:
            if getattr(cfg, s.name) and not f.asked(cfg):
                return f"{s.flag} says where {f.flag} looks: give {f.flag} too"
    on = [f for f in FLAGGED if f.asked(cfg)]
    for f in on:
        why = f.refuse(points) if f.refuse is not None else ""
        if why:
            return f"{f.flag} {why}"
    for f in on:
        if fmt == RECORD_PCAP and f.room:
            return f"{f.flag}: a pcap file has no room for the {f.room}; write pcapng (-w FILE.pcapng)"
    return ""


def in_comment(cfg) -> list[str]:
    """The flags of the features `cfg` asks for that write into the comment (--no-comment refuses them)."""
    return [f.flag for f in FLAGGED if f.room and f.asked(cfg)]
