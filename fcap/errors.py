"""fcap's errors, one root: str() of each is the one line the user sees (the CLI adds "fcap: ")."""

from __future__ import annotations


class FcapError(Exception):
    """Anything fcap cannot do, said in one line. `errno` when a system call said why, else None."""

    errno: int | None = None


class UsageError(FcapError):
    """Command-line arguments that make no sense (exit status 2)."""


class PointError(FcapError):
    """A capture point that cannot be used: the message says which and why."""


class FilterError(FcapError):
    """An expression libpcap would not compile; the message is libpcap's."""


class PredicateError(FcapError):
    """A predicate that cannot be compiled; the message names the path and the cause."""


class ProgramError(FcapError):
    """The capture program cannot be built for this point (a missing BTF member, ...)."""


class CaptureError(FcapError):
    """A capture that cannot start or go on."""


class CommandError(FcapError):
    """The command given after -- could not be started."""


class PcapFormatError(FcapError):
    """The input is not a readable pcap/pcapng file; the message says what is wrong and where."""


class PathError(FcapError):
    """A BTF member path (--where, --dump) that does not resolve at a point; the message names the member that
    does not exist and those that do."""
