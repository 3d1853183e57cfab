"""Whole records that lie scattered in memory, written in one order without a copy per record: an (n, 2) array of
(address, length) pairs (numpy's uint64, each pair one whole record, the memory the caller's own) handed to libc's
writev IOV_MAX pairs at a time, neighbours that touch joined first; partial writes (a pipe, a signal) go on where
they stopped."""

from __future__ import annotations

import ctypes
import errno
import os

import numpy as np

IOV_MAX = 1024

_libc = ctypes.CDLL(None, use_errno=True)   # (the process's own symbols: no ldconfig run, as bpf.sys)
_writev = _libc.writev
_writev.restype = ctypes.c_ssize_t
_writev.argtypes = (ctypes.c_int, ctypes.c_void_p, ctypes.c_int)


def total(iov) -> int:
    return int(iov[:, 1].sum())


def joined(iov):
    """The pairs with each run of records that follow one another in memory made one pair."""
    if len(iov) < 2:
        return iov
    addr, size = iov[:, 0], iov[:, 1]
    starts = np.flatnonzero(addr[1:] != addr[:-1] + size[:-1]) + 1
    if len(starts) == len(iov) - 1:
        return iov
    starts = np.concatenate(([0], starts))
    out = iov[starts]
    out[:, 1] = np.add.reduceat(size, starts)
    return out


def write_all(fd: int, iov) -> int:
    """Write the records to fd in order; returns the bytes written. On failure the OSError raised carries
    `written`: the bytes that went before it."""
    iov = np.ascontiguousarray(joined(iov))
    ends = np.cumsum(iov[:, 1])
    at = iov.__array_interface__["data"][0]    # (pair i at at + 16 * i)
    done, i, n = 0, 0, len(iov)
    while i < n:
        k = min(IOV_MAX, n - i)
        got = _writev(fd, at + 16 * i, k)
        if got < 0:
            err = ctypes.get_errno()
            if err == errno.EINTR:
                continue
            e = OSError(err, os.strerror(err))   # (EPIPE: a BrokenPipeError, as os.writev raises)
            e.written = done
            raise e
        done += got
        if done == int(ends[i + k - 1]):
            i += k
            continue
        # part of the batch went (a pipe, a signal): on from the byte where it stopped, its pair cut in a copy
        i = int(np.searchsorted(ends, done, "right"))
        iov = iov[i:].copy()
        ends = ends[i:]
        cut = done - int(ends[0] - iov[0, 1])
        iov[0, 0] += cut
        iov[0, 1] -= cut
        at, i, n = iov.__array_interface__["data"][0], 0, len(iov)
    return done


def whole(iov, written: int) -> int:
    """How many of the first `written` bytes are whole records."""
    if not len(iov):
        return 0
    ends = iov[:, 1].cumsum()
    k = int((ends <= written).sum())
    return int(ends[k - 1]) if k else 0


def first_past(iov, room: int) -> int:
    """The index of the first record that starts more than `room` bytes in (len(iov) when none does)."""
    if not len(iov):
        return 0
    ends = iov[:, 1].cumsum()
    starts = ends - iov[:, 1]
    return int((starts <= room).sum())


def gather(iov) -> bytes:
    """The records as one bytes object (for an output without a file descriptor)."""
    return b"".join(ctypes.string_at(int(a), int(n)) for a, n in iov.tolist())
