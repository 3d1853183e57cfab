"""BPF maps: array, per-CPU array, hash (plain or LRU), stack trace and perf event array (their fds and element
access)."""

from __future__ import annotations

import ctypes
import errno
import os
import struct

from .errors import SyscallError
from .sys import FD, FDOwner, MapBatchAttr, MapCreateAttr, MapElemAttr, addr, bpf, bpf_errno
from .uapi import BPF_OBJ_NAME_LEN, Cmd, MapType, UpdateFlags


def possible_cpus() -> int:
    """Number of possible CPUs (the size of per-CPU values), from /sys/devices/system/cpu/possible."""
    try:
        text = open("/sys/devices/system/cpu/possible").read().strip()
    except OSError:
        return os.cpu_count() or 1
    n = 0
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        n = max(n, int(hi or lo) + 1)
    return n


def online_cpus() -> list[int]:
    try:
        text = open("/sys/devices/system/cpu/online").read().strip()
    except OSError:
        return list(range(os.cpu_count() or 1))
    cpus: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        cpus.extend(range(int(lo), int(hi or lo) + 1))
    return cpus


class Map(FDOwner):
    """A map the kernel holds: fd, type, key and value sizes. Keys and values are bytes."""

    def __init__(self, map_type: MapType, key_size: int, value_size: int, max_entries: int,
                 flags: int = 0, name: str = ""):
        self.type = MapType(map_type)
        self.key_size, self.value_size, self.max_entries = key_size, value_size, max_entries
        self.name = name
        attr = MapCreateAttr(map_type=self.type, key_size=key_size, value_size=value_size,
                             max_entries=max_entries, map_flags=flags, map_name=name.encode()[:BPF_OBJ_NAME_LEN - 1])
        self.fd = FD(bpf(Cmd.MAP_CREATE, attr, f"create {self.type.name.lower()} map {name or ''}".strip()))

    @property
    def _value_bytes(self) -> int:
        return self.value_size

    def _key(self, key) -> ctypes.Array:
        if isinstance(key, int):
            key = key.to_bytes(self.key_size, "little")
        if len(key) != self.key_size:
            raise ValueError(f"map {self.name}: key of {len(key)} bytes, want {self.key_size}")
        return ctypes.create_string_buffer(bytes(key), self.key_size)

    def lookup(self, key) -> bytes | None:
        k = self._key(key)
        v = ctypes.create_string_buffer(self._value_bytes)
        attr = MapElemAttr(map_fd=self.fd.fileno(), key=addr(k), value=addr(v))
        ret, err = bpf_errno(Cmd.MAP_LOOKUP_ELEM, attr)
        if ret < 0:
            if err == errno.ENOENT:
                return None
            raise SyscallError(f"look up in map {self.name}", err)
        return v.raw

    def update(self, key, value: bytes, flags: UpdateFlags = UpdateFlags.ANY) -> None:
        k = self._key(key)
        if len(value) != self._value_bytes:
            raise ValueError(f"map {self.name}: value of {len(value)} bytes, want {self._value_bytes}")
        v = ctypes.create_string_buffer(bytes(value), len(value))
        attr = MapElemAttr(map_fd=self.fd.fileno(), key=addr(k), value=addr(v), flags=flags)
        bpf(Cmd.MAP_UPDATE_ELEM, attr, f"update map {self.name}")

    def delete(self, key) -> None:
        k = self._key(key)
        bpf(Cmd.MAP_DELETE_ELEM, MapElemAttr(map_fd=self.fd.fileno(), key=addr(k)), f"delete from map {self.name}")


class ArrayMap(Map):
    def __init__(self, value_size: int, max_entries: int, name: str = "", flags: int = 0):
        super().__init__(MapType.ARRAY, 4, value_size, max_entries, flags, name)
        self.stride = (value_size + 7) & ~7

    def mmap(self):
        """The values of an array made with MapFlags.MMAPABLE, shared with the kernel, read-write: element i
        at i * stride."""
        import mmap
        size = self.stride * self.max_entries
        size = (size + mmap.PAGESIZE - 1) & ~(mmap.PAGESIZE - 1)
        return mmap.mmap(self.fd.fileno(), size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)


class HashMap(Map):
    """A hash map (lru=True: the kernel evicts the least recently used entry when it is full)."""

    def __init__(self, key_size: int, value_size: int, max_entries: int, name: str = "", lru: bool = False,
                 flags: int = 0):
        super().__init__(MapType.LRU_HASH if lru else MapType.HASH, key_size, value_size, max_entries, flags, name)

    def keys(self):
        """Every key, as bytes (BPF_MAP_GET_NEXT_KEY from the start; a map changing meanwhile may repeat or skip
        some)."""
        cur = None
        nxt = ctypes.create_string_buffer(self.key_size)
        while True:
            k = self._key(cur) if cur is not None else None
            attr = MapElemAttr(map_fd=self.fd.fileno(), key=addr(k), value=addr(nxt))
            ret, err = bpf_errno(Cmd.MAP_GET_NEXT_KEY, attr)
            if ret < 0:
                if err == errno.ENOENT:
                    return
                raise SyscallError(f"walk map {self.name}", err)
            cur = nxt.raw
            yield cur

    def items(self):
        """(key, value) of every entry (the ones deleted during the walk left out)."""
        for k in self.keys():
            v = self.lookup(k)
            if v is not None:
                yield k, v


class PerCPUArrayMap(Map):
    """Values are one slot per possible CPU, each rounded up to 8 bytes."""

    def __init__(self, value_size: int, max_entries: int, name: str = ""):
        super().__init__(MapType.PERCPU_ARRAY, 4, value_size, max_entries, 0, name)
        self.ncpus = possible_cpus()
        self.stride = (value_size + 7) & ~7

    @property
    def _value_bytes(self) -> int:
        return self.stride * self.ncpus

    def lookup_percpu(self, key) -> list[bytes]:
        raw = self.lookup(key) or b""
        return [raw[i * self.stride: i * self.stride + self.value_size] for i in range(self.ncpus)]

    def lookup_all_percpu(self) -> list[list[bytes]]:
        """Every key's per-CPU values, in key order: a few BPF_MAP_LOOKUP_BATCH calls (5.6+), else a lookup per key
        (thousands of keys: one call per key is most of a large capture's exit under TCG)."""
        n = self.max_entries
        keys = (ctypes.c_uint32 * n)()
        values = ctypes.create_string_buffer(self._value_bytes * n)
        token = ctypes.c_uint32()
        attr = MapBatchAttr(out_batch=addr(token), keys=addr(keys), values=addr(values), count=n,
                            map_fd=self.fd.fileno())
        ret, err = bpf_errno(Cmd.MAP_LOOKUP_BATCH, attr)
        if (ret < 0 and err != errno.ENOENT) or attr.count != n:   # (ENOENT: the end reached, all given)
            return [self.lookup_percpu(k) for k in range(n)]
        raw, vb = values.raw, self._value_bytes
        out: list[list[bytes]] = [[] for _ in range(n)]
        for i, k in enumerate(keys):
            v = raw[i * vb: (i + 1) * vb]
            out[k] = [v[c * self.stride: c * self.stride + self.value_size] for c in range(self.ncpus)]
        return out

    def sum_u64(self, key, offset: int = 0) -> int:
        """Sum over CPUs of the u64 at `offset` in this key's value."""
        return sum(int.from_bytes(v[offset: offset + 8], "little") for v in self.lookup_percpu(key))


class StackTraceMap(Map):
    """Kernel or user stacks that bpf_get_stackid stores, deduplicated by the kernel: key a u32 stack id, value up to
    `depth` u64 addresses, innermost first (0 past the stack's last frame)."""

    def __init__(self, depth: int, max_entries: int, name: str = ""):
        super().__init__(MapType.STACK_TRACE, 4, 8 * depth, max_entries, 0, name)
        self.depth = depth

    def addresses(self, stack_id: int) -> tuple[int, ...] | None:
        """The stack's addresses, innermost first; None when the map holds no stack of that id."""
        raw = self.lookup(stack_id)
        if raw is None:
            return None
        addrs = struct.unpack_from(f"<{self.depth}Q", raw)
        n = addrs.index(0) if 0 in addrs else self.depth
        return addrs[:n]


class PerfEventArrayMap(Map):
    """Key: CPU number; value: a perf event fd (set by bpf.perfbuf)."""

    def __init__(self, max_entries: int | None = None, name: str = ""):
        super().__init__(MapType.PERF_EVENT_ARRAY, 4, 4, max_entries or possible_cpus(), 0, name)

