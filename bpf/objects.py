"""The kernel's loaded programs and links, read back by id (BPF_*_GET_NEXT_ID, *_GET_FD_BY_ID, OBJ_GET_INFO_BY_FD):
each program's type, name, tag and own BTF with its functions (func_info), each link's program and target
device; a program's BTF as bytes; pinning an object in bpffs."""

from __future__ import annotations

import ctypes
import errno
from typing import NamedTuple

from .errors import SyscallError
from .sys import FD, BtfInfo, GetIdAttr, ProgInfo, addr, bpf, bpf_errno, obj_info
from .uapi import Cmd


class ProgDesc(NamedTuple):
    """A loaded program as the kernel describes it."""

    id: int
    type: int            # ProgType's number
    name: str            # the kernel's copy (15 characters at most)
    tag: str             # hex
    btf_id: int          # its BTF object's id (0: loaded without BTF)
    funcs: tuple         # func_info: (instruction offset, BTF FUNC id) of each of its functions, the main one first


class LinkDesc(NamedTuple):
    """A link as the kernel describes it; for a device's link (xdp, tcx, netkit) its ifindex and attach type."""

    id: int
    type: int            # LinkType's number
    prog_id: int
    ifindex: int
    attach_type: int


class LinkInfo(ctypes.Structure):
    _fields_ = [("type", ctypes.c_uint32), ("id", ctypes.c_uint32), ("prog_id", ctypes.c_uint32),
                ("_pad", ctypes.c_uint32), ("ifindex", ctypes.c_uint32), ("attach_type", ctypes.c_uint32),
                ("_rest", ctypes.c_uint64 * 7)]


class ObjPinAttr(ctypes.Structure):
    _fields_ = [("pathname", ctypes.c_uint64), ("bpf_fd", ctypes.c_uint32), ("file_flags", ctypes.c_uint32)]


def _ids(cmd: Cmd, what: str) -> list[int]:
    out, start = [], 0
    while True:
        attr = GetIdAttr(start_id=start)
        ret, err = bpf_errno(cmd, attr)
        if ret < 0:
            if err == errno.ENOENT:   # the end
                return out
            raise SyscallError(f"list {what}", err)
        start = attr.next_id
        out.append(start)


def prog_ids() -> list[int]:
    return _ids(Cmd.PROG_GET_NEXT_ID, "BPF programs")


def link_ids() -> list[int]:
    return _ids(Cmd.LINK_GET_NEXT_ID, "BPF links")


def open_prog(prog_id: int) -> FD:
    """The fd of program `prog_id` (SyscallError ENOENT when it is gone)."""
    return FD(bpf(Cmd.PROG_GET_FD_BY_ID, GetIdAttr(start_id=prog_id), f"open BPF program {prog_id}"))


def prog_desc(fd: int) -> ProgDesc:
    info = obj_info(fd, ProgInfo(), "read a program's info")
    n = info.nr_func_info
    funcs: tuple = ()
    if n and info.func_info_rec_size >= 8:
        size = info.func_info_rec_size
        buf = ctypes.create_string_buffer(n * size)
        again = ProgInfo(nr_func_info=n, func_info_rec_size=size, func_info=addr(buf))
        obj_info(fd, again, "read a program's func_info")
        raw = buf.raw
        funcs = tuple((int.from_bytes(raw[i * size:i * size + 4], "little"),
                       int.from_bytes(raw[i * size + 4:i * size + 8], "little")) for i in range(n))
    return ProgDesc(info.id, info.type, info.name.decode(errors="replace"), bytes(info.tag).hex(), info.btf_id,
                    funcs)


def programs() -> list[ProgDesc]:
    """Every loaded program (those unloaded while listing left out)."""
    out = []
    for i in prog_ids():
        try:
            with open_prog(i) as fd:
                out.append(prog_desc(fd.fileno()))
        except SyscallError as e:
            if e.errno != errno.ENOENT:
                raise
    return out


def btf_data(btf_id: int) -> bytes:
    """The raw bytes of BTF object `btf_id` (a program's own BTF)."""
    with FD(bpf(Cmd.BTF_GET_FD_BY_ID, GetIdAttr(start_id=btf_id), f"open BTF object {btf_id}")) as fd:
        info = obj_info(fd.fileno(), BtfInfo(), f"read info of BTF object {btf_id}")
        buf = ctypes.create_string_buffer(info.btf_size)
        obj_info(fd.fileno(), BtfInfo(btf=addr(buf), btf_size=info.btf_size), f"read BTF object {btf_id}")
        return buf.raw


def links() -> list[LinkDesc]:
    """Every link (those gone while listing left out); ifindex and attach type are 0 but for device links."""
    out = []
    for i in link_ids():
        try:
            with FD(bpf(Cmd.LINK_GET_FD_BY_ID, GetIdAttr(start_id=i), f"open BPF link {i}")) as fd:
                info = obj_info(fd.fileno(), LinkInfo(), f"read info of BPF link {i}")
        except SyscallError as e:
            if e.errno != errno.ENOENT:
                raise
            continue
        out.append(LinkDesc(info.id, info.type, info.prog_id, info.ifindex, info.attach_type))
    return out


def pin(fd: int, path: str) -> None:
    """BPF_OBJ_PIN: `path` in a bpffs names the object until unlinked."""
    name = ctypes.create_string_buffer(path.encode())
    bpf(Cmd.OBJ_PIN, ObjPinAttr(pathname=addr(name), bpf_fd=fd), f"pin {path}")
