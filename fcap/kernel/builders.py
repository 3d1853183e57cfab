"""The capture program for any point: the skb program (fcap.kernel.program), or at an XDP program's entry and exit
the one that reads an xdp_buff (fcap.kernel.xdpprog)."""

from __future__ import annotations

from bpf.btf import BTFError

from fcap.errors import ProgramError
from fcap.kernel.program import Builder
from fcap.kernel.progopts import Maps, ProgramOptions
from fcap.kernel.xdpprog import XdpBuilder
from fcap.points.kinds import SKB_STRUCT, XDP_STRUCT
from fcap.points.spec import Point

BUILDERS = {SKB_STRUCT: Builder, XDP_STRUCT: XdpBuilder}   # by the struct the point's context argument points to


def build(point: Point, opts: ProgramOptions, maps: Maps) -> list:
    """The instructions (with labels) of the capture program for `point`."""
    try:
        return BUILDERS[point.kind.context](point, opts, maps).build()
    except BTFError as e:   # a kernel's BTF without what the program reads (or a corrupt one)
        raise ProgramError(f"{point.spec}: cannot read the kernel's BTF: {e}") from None
