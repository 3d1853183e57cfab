"""ELF files, as far as uprobes need them: a function's symbol by name (.symtab, else .dynsym) and the file offset
of its first instruction (its address through the PT_LOAD program headers), what a uprobe's config2 takes.
64-bit little-endian files only."""

from __future__ import annotations

import os
import struct
from typing import NamedTuple

from .errors import ElfError, NoSymbol

_IDENT = b"\x7fELF\x02\x01"   # magic, ELFCLASS64, ELFDATA2LSB
_HEADER = struct.Struct("<16sHHIQQQIHHHHHH")   # Elf64_Ehdr
_SECTION = struct.Struct("<IIQQQQIIQQ")        # Elf64_Shdr
_SEGMENT = struct.Struct("<IIQQQQQQ")          # Elf64_Phdr
_SYMBOL = struct.Struct("<IBBHQQ")             # Elf64_Sym
SHT_SYMTAB, SHT_DYNSYM = 2, 11
PT_LOAD = 1
STT_FUNC = 2
SHN_UNDEF = 0


class Symbol(NamedTuple):
    name: str
    address: int   # st_value: the virtual address it is linked at
    size: int


class Segment(NamedTuple):
    offset: int    # p_offset
    address: int   # p_vaddr
    filesz: int


class Elf:
    """One ELF file's section headers and loadable segments, read when made; its symbols read when asked."""

    def __init__(self, path: str):
        self.path = path
        try:
            with open(path, "rb") as f:
                self._fd = os.dup(f.fileno())
        except OSError as e:
            raise ElfError(f"read {path}", e.strerror or str(e), e.errno) from None
        try:
            self._headers()
        except BaseException:
            os.close(self._fd)
            raise

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _read(self, offset: int, size: int) -> bytes:
        try:
            data = os.pread(self._fd, size, offset)
        except OSError as e:
            raise ElfError(f"read {self.path}", e.strerror or str(e), e.errno) from None
        if len(data) != size:
            raise ElfError(f"read {self.path}", f"truncated ({size} bytes at {offset} wanted)")
        return data

    def _headers(self) -> None:
        head = self._read(0, _HEADER.size) if os.fstat(self._fd).st_size >= _HEADER.size else b""
        if not head.startswith(_IDENT):
            raise ElfError(f"read {self.path}", "not a 64-bit little-endian ELF file")
        (_i, _t, _m, _v, _e, phoff, shoff, _f, _eh, phentsize, phnum, shentsize, shnum, _x) = _HEADER.unpack(head)
        if phnum and phentsize < _SEGMENT.size or shnum and shentsize < _SECTION.size:
            raise ElfError(f"read {self.path}", "malformed ELF header")
        phs = self._read(phoff, phentsize * phnum)
        self.segments = [Segment(off, vaddr, filesz) for ptype, _fl, off, vaddr, _pa, filesz, _mem, _al in
                         (_SEGMENT.unpack_from(phs, i * phentsize) for i in range(phnum)) if ptype == PT_LOAD]
        shs = self._read(shoff, shentsize * shnum)
        self.sections = [_SECTION.unpack_from(shs, i * shentsize) for i in range(shnum)]

    def symbol(self, name: str) -> Symbol:
        """The defined function `name` (.symtab first, then .dynsym); NoSymbol when neither has it."""
        for wanted in (SHT_SYMTAB, SHT_DYNSYM):
            for sh in self.sections:
                if sh[1] == wanted:
                    found = self._in_table(sh, name)
                    if found is not None:
                        return found
        raise NoSymbol(self.path, name)

    def _in_table(self, sh: tuple, name: str) -> Symbol | None:
        _n, _t, _fl, _a, offset, size, link, _i, _al, entsize = sh
        if entsize < _SYMBOL.size or link >= len(self.sections):
            return None
        strs = self._read(self.sections[link][4], self.sections[link][5])
        want = name.encode() + b"\0"
        starts, at = set(), strs.find(want)
        while at >= 0:   # (every place the name starts: a table may share one string's tail with another name)
            starts.add(at)
            at = strs.find(want, at + 1)
        if not starts:
            return None
        table = self._read(offset, size - size % entsize)
        for i in range(0, len(table), entsize):
            st_name, info, _o, shndx, value, sym_size = _SYMBOL.unpack_from(table, i)
            if st_name in starts and info & 0xF == STT_FUNC and shndx != SHN_UNDEF:
                return Symbol(name, value, sym_size)
        return None

    def file_offset(self, address: int) -> int:
        """Where in the file the byte linked at virtual `address` lies (the PT_LOAD segment holding it)."""
        for seg in self.segments:
            if seg.address <= address < seg.address + seg.filesz:
                return address - seg.address + seg.offset
        raise ElfError(f"read {self.path}", f"no loadable segment holds address {address:#x}")


def symbol_offset(path: str, name: str) -> int:
    """The file offset of function `name`'s first instruction in the ELF file at `path` (a uprobe's place).
    ElfError when the file cannot be read or is no 64-bit little-endian ELF; NoSymbol when it has no such
    function (or was stripped of its symbols)."""
    with Elf(path) as elf:
        return elf.file_offset(elf.symbol(name).address)
