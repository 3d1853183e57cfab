"""The one way the flagged features (fcap.features.FLAGGED) become a capture's Config and are refused: the command
line's flags (fcap.commands.capture) and the API's keywords (fcap.api) go through here."""

from __future__ import annotations

from typing import Callable

from fcap.errors import UsageError
from fcap.features import FLAGGED
from fcap.kernel.layout import RECORD_PCAP


def keywords() -> set:
    """The API keywords the flagged features, their shorthands and their settings own (a shorthand's is not a
    Config field: its value joins its feature's)."""
    return {n for f in FLAGGED for n in [f.name] + [s.name for s in f.settings + f.shorthands]}


def asked(said: Callable[[str], object]) -> dict:
    """{Config field: value} of every flagged feature and its settings, `said(name)` what the flag or keyword of
    that name said: a feature on or off, or with a metavar its values (a tuple: those given, then its shorthands'
    not among them); a setting's values (a tuple). UsageError: a value that is not a string."""
    out: dict = {}
    for f in FLAGGED:
        if f.metavar:
            values = _strings(said(f.name), f.name)
            out[f.name] = values + tuple(s.value for s in f.shorthands if said(s.name) and s.value not in values)
        else:
            out[f.name] = bool(said(f.name))
        for s in f.settings:
            out[s.name] = _strings(said(s.name), s.name)
    return out


def _strings(value, name: str) -> tuple:
    """A flag's or keyword's values: one string or several."""
    values = (value,) if isinstance(value, str) else tuple(value or ())
    if not all(isinstance(v, str) for v in values):
        raise UsageError(f"{name}: strings, not {value!r}")
    return values


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
            return f"{f.flag_of(cfg)}: a pcap file has no room for the {f.room}; write pcapng (-w FILE.pcapng)"
    return ""


def in_comment(cfg) -> list[str]:
    """The flags of the features `cfg` asks for that write into the comment (--no-comment refuses them)."""
    return [f.flag_of(cfg) for f in FLAGGED if f.room and f.asked(cfg)]
