"""Per-boot caches of what is made from the kernel's BTF. The vmlinux BTF itself (sysfs hands it out 4 KiB per
read(): ~1,400 system calls) with its index (each type record's word offset, kind and name offset, so that a start
does not walk the ~130,000 records in Python); and any blob a caller derives from BTF (e.g. fcap's list of capture
points). Each file is keyed by the identity of the BTF it came from (file size, mtime, the boot id) and CRC-checked;
kept under $XDG_CACHE_HOME/fcap, else /run/fcap (root) or ~/.cache/fcap; rebuilt when the key differs."""

from __future__ import annotations

import os
import struct
import sys
import zlib
from array import array

MAGIC = b"fcapbtf4"
_HEAD = struct.Struct("<8sIII")      # magic, key length, data length, CRC-32 of key and data
_VMLINUX = struct.Struct("<II")      # record count, blob length (then the blob, offsets, name offsets, kinds)


def cache_dir() -> str:
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg:
        return os.path.join(xdg, "fcap")
    if os.geteuid() == 0:
        return "/run/fcap"
    return os.path.join(os.path.expanduser("~"), ".cache", "fcap")


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return "?"


def key(*paths: str) -> bytes:
    """The identity of the BTF files at `paths` for this boot: names, sizes, mtimes, the boot id (and the byte
    order of what is cached). Raises OSError for a file that cannot be examined."""
    parts = [_boot_id(), sys.byteorder]
    for path in paths:
        st = os.stat(path)
        parts.append(f"{os.path.basename(path)}:{st.st_size}:{st.st_mtime_ns}")
    return " ".join(parts).encode()


def _file(name: str) -> str:
    return os.path.join(cache_dir(), f"{name}.btfcache")


def read(name: str, ident: bytes) -> memoryview | None:
    """The data cached as `name` under the key `ident` (a read-only view of the file, mapped), or None (absent,
    stale, damaged)."""
    import mmap
    try:
        with open(_file(name), "rb") as f:
            mm = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
    except (OSError, ValueError):    # (ValueError: an empty file cannot be mapped)
        return None
    data = memoryview(mm)
    if len(data) < _HEAD.size:
        return None
    magic, klen, dlen, crc = _HEAD.unpack_from(data)
    at = _HEAD.size
    if magic != MAGIC or len(data) != at + klen + dlen or data[at:at + klen] != ident:
        return None
    if zlib.crc32(data[at:]) != crc:   # (~2 ms for vmlinux: a damaged file must not give wrong types)
        return None
    return data[at + klen:]


def write(name: str, ident: bytes, *parts: bytes) -> None:
    """Cache the concatenated parts as `name` under `ident` (atomically: a temporary file renamed over the old
    one). Failures are ignored: the cache only saves time."""
    path = _file(name)
    tmp = f"{path}.{os.getpid()}"
    body = b"".join((ident, *parts))
    try:
        os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
        with open(tmp, "wb") as f:
            f.write(_HEAD.pack(MAGIC, len(ident), len(body) - len(ident), zlib.crc32(body)))
            f.write(body)
        os.replace(tmp, path)
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass


def load(name: str, ident: bytes) -> tuple[memoryview, array, bytearray, array] | None:
    """A BTF blob cached by store(): (blob, offsets, kinds, name offsets), or None."""
    data = read(name, ident)
    if data is None or len(data) < _VMLINUX.size:
        return None
    n, blen = _VMLINUX.unpack_from(data)
    at = _VMLINUX.size
    if len(data) != at + blen + 9 * n:
        return None
    blob = data[at:at + blen]
    at += blen
    offs, names = array("I"), array("I")
    offs.frombytes(data[at:at + 4 * n])
    names.frombytes(data[at + 4 * n:at + 8 * n])
    return blob, offs, bytearray(data[at + 8 * n:]), names


def store(name: str, ident: bytes, blob: bytes, offs, kinds: bytes, names) -> None:
    """Cache a BTF blob with its index (each record's word offset, kind and name offset)."""
    offs, names = array("I", offs), array("I", names)
    write(name, ident, _VMLINUX.pack(len(offs), len(blob)), blob, offs.tobytes(), names.tobytes(), bytes(kinds))
