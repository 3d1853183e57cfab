"""The conservative variants of a capture program: what it gives up, one thing at a time, when the preferred program
is refused (by the kernel's verifier, or by fcap's own pointer-kind check before the kernel sees it)."""

from __future__ import annotations

from typing import NamedTuple


class Variant(NamedTuple):
    option: str   # the ProgramOptions field the variant turns off
    what: str     # what the capture does instead, for the one-line note (and `fcap features`)


# Most preferred first: each is tried in turn, on top of those before it, until a program loads
CONSERVATIVE: tuple[Variant, ...] = (
    Variant("head_loads", "packet bytes read from a copy, not in place through skb->head"),
    Variant("task_btf", "pid/tid and comm through the older helpers, not bpf_get_current_task_btf"),
)


def applicable(opts) -> list[Variant]:
    """The variants that change something in a program built with `opts` (a ProgramOptions)."""
    return [v for v in CONSERVATIVE if getattr(opts, v.option)]


def without(opts, given_up: set[str]):
    """`opts` with the options of the variants given up turned off."""
    return opts._replace(**{name: False for name in given_up}) if given_up else opts
