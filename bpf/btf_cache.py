"""A per-boot cache of the vmlinux BTF: the blob itself (sysfs hands it out 4 KiB per read(): ~1,400 system calls)
and its index (each type record's word offset, kind and name offset, so that a start does not walk the ~130,000
records in Python). Keyed by the BTF file's size and mtime and the boot id; kept under $XDG_CACHE_HOME/fcap, else
/run/fcap (root) or ~/.cache/fcap; rebuilt when the key differs."""

from __future__ import annotations

import os
import struct
import sys
import zlib
from array import array

MAGIC = b"fcapbtf3"
_HEAD = struct.Struct("<8sIIII")      # magic, key length, record count, blob length, CRC-32 of the rest


def cache_dir() -> str:
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg:
        return os.path.join(xdg, "fcap")
    if os.geteuid() == 0:
        return "/run/fcap"
    return os.path.join(os.path.expanduser("~"), ".cache", "fcap")


def key(path: str) -> bytes:
    """The identity of the BTF at `path` for this boot: size, mtime, boot id (and the byte order of the index)."""
    st = os.stat(path)
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = "?"
    return f"{os.path.basename(path)} {st.st_size} {st.st_mtime_ns} {boot} {sys.byteorder}".encode()


def _file(name: str) -> str:
    return os.path.join(cache_dir(), f"{name}.btfidx")


def load(name: str, ident: bytes) -> tuple[bytes, array, bytearray, array] | None:
    """(blob, offsets, kinds, name offsets) cached for `name` under the key `ident`, or None (absent, stale,
    damaged)."""
    try:
        with open(_file(name), "rb") as f:
            data = f.read()
    except OSError:
        return None
    if len(data) < _HEAD.size:
        return None
    magic, klen, n, blen, crc = _HEAD.unpack_from(data)
    at = _HEAD.size
    if magic != MAGIC or data[at:at + klen] != ident or len(data) != at + klen + blen + 9 * n:
        return None
    if zlib.crc32(memoryview(data)[at:]) != crc:   # (~2 ms: a damaged file must not give wrong types)
        return None
    at += klen
    blob = data[at:at + blen]
    at += blen
    offs, names = array("I"), array("I")
    offs.frombytes(data[at:at + 4 * n])
    names.frombytes(data[at + 4 * n:at + 8 * n])
    return blob, offs, bytearray(data[at + 8 * n:]), names


def store(name: str, ident: bytes, blob: bytes, offs, kinds: bytes, names) -> None:
    """Write the blob and its index (atomically: a temporary file renamed over the old one). Failures are ignored:
    the cache only saves time."""
    offs, names = array("I", offs), array("I", names)
    path = _file(name)
    tmp = f"{path}.{os.getpid()}"
    try:
        os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
        body = b"".join((ident, blob, offs.tobytes(), names.tobytes(), bytes(kinds)))
        with open(tmp, "wb") as f:
            f.write(_HEAD.pack(MAGIC, len(ident), len(offs), len(blob), zlib.crc32(body)))
            f.write(body)
        os.replace(tmp, path)
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass
