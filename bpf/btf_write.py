"""Writing BTF: a program's own type information (a few ints, pointers, structs and its functions), encoded as the
kernel reads it and loaded with BPF_BTF_LOAD, so a program can carry func_info (what fentry/fexit on a BPF program
needs: the target's functions by BTF id)."""

from __future__ import annotations

import ctypes
import struct

from .errors import SyscallError
from .sys import FD, addr, bpf_errno
from .uapi import Cmd

MAGIC, VERSION, HDR_LEN = 0xEB9F, 1, 24
KIND_INT, KIND_PTR, KIND_STRUCT, KIND_FUNC, KIND_FUNC_PROTO = 1, 2, 4, 12, 13
INT_SIGNED = 1
LINKAGE_STATIC, LINKAGE_GLOBAL = 0, 1
LOG_SIZE = 64 * 1024


class BTFLoadAttr(ctypes.Structure):
    _fields_ = [("btf", ctypes.c_uint64), ("btf_log_buf", ctypes.c_uint64), ("btf_size", ctypes.c_uint32),
                ("btf_log_size", ctypes.c_uint32), ("btf_log_level", ctypes.c_uint32)]


class BTFWriter:
    """Types added one by one (each add_* returns the new type's id, from 1), then encode() or load()."""

    def __init__(self) -> None:
        self._types: list[bytes] = []
        self._strs = bytearray(b"\0")
        self._offs: dict[str, int] = {"": 0}

    def _str(self, s: str) -> int:
        if s not in self._offs:
            self._offs[s] = len(self._strs)
            self._strs += s.encode() + b"\0"
        return self._offs[s]

    def _add(self, name: str, kind: int, vlen: int, size_or_type: int, tail: bytes = b"") -> int:
        self._types.append(struct.pack("<III", self._str(name), kind << 24 | vlen, size_or_type) + tail)
        return len(self._types)

    def add_int(self, name: str, size: int, signed: bool = False) -> int:
        return self._add(name, KIND_INT, 0, size, struct.pack("<I", (INT_SIGNED if signed else 0) << 24 | size * 8))

    def add_ptr(self, target: int) -> int:
        return self._add("", KIND_PTR, 0, target)

    def add_struct(self, name: str, size: int) -> int:
        """A struct without members: enough to name a program's context (struct xdp_md, struct __sk_buff)."""
        return self._add(name, KIND_STRUCT, 0, size)

    def add_func_proto(self, ret: int, params: list[tuple[str, int]]) -> int:
        tail = b"".join(struct.pack("<II", self._str(n), t) for n, t in params)
        return self._add("", KIND_FUNC_PROTO, len(params), ret, tail)

    def add_func(self, name: str, proto: int, linkage: int = LINKAGE_GLOBAL) -> int:
        return self._add(name, KIND_FUNC, linkage, proto)

    def encode(self) -> bytes:
        types = b"".join(self._types)
        return struct.pack("<HBBIIIII", MAGIC, VERSION, 0, HDR_LEN, 0, len(types), len(types),
                           len(self._strs)) + types + bytes(self._strs)

    @classmethod
    def one_function(cls, name: str, ctx_struct: str) -> tuple[BTFWriter, int]:
        """The BTF of one function `int NAME(struct CTX *ctx)` (a program's main function) and its FUNC id."""
        w = cls()
        int_id = w.add_int("int", 4, signed=True)
        ptr = w.add_ptr(w.add_struct(ctx_struct, 0))
        return w, w.add_func(name, w.add_func_proto(int_id, [("ctx", ptr)]))

    def load(self) -> FD:
        """BPF_BTF_LOAD: the fd of the kernel's BTF object (SyscallError with the kernel's log when refused)."""
        data = self.encode()
        buf = ctypes.create_string_buffer(data, len(data))
        log = ctypes.create_string_buffer(LOG_SIZE)
        attr = BTFLoadAttr(btf=addr(buf), btf_size=len(data), btf_log_buf=addr(log), btf_log_size=LOG_SIZE,
                           btf_log_level=1)
        fd, err = bpf_errno(Cmd.BTF_LOAD, attr)
        if fd < 0:
            lines = log.value.decode(errors="replace").strip().splitlines()
            raise SyscallError("load BTF", err, lines[-1] if lines else "")
        return FD(fd)
