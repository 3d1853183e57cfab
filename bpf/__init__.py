"""A pure-Python BPF toolkit: BTF, assembler, syscalls, maps, buffers, links, cBPF translation."""

from .errors import BPFError

__all__ = ["BPFError"]
