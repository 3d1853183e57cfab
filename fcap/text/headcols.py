"""Columns of a batch's head matrix (a row per packet of its first bytes: fcap.text.fastlines.first_bytes): a byte,
a big-endian 16- or 32-bit field at any offset, the sum of consecutive 16-bit words, each for the whole batch at
once as int64. A field is one strided cast of the rows' bytes seen as big-endian words (~5 times cheaper than a
cast per byte, shifted and or-ed)."""

from __future__ import annotations

from fcap.live.fastmerge import np


def u8(head, o: int):
    return head[:, o].astype(np.int64)


def be16(head, o: int):
    return head[:, o:o + 2].view(">u2")[:, 0].astype(np.int64)


def be32(head, o: int):
    return head[:, o:o + 4].view(">u4")[:, 0].astype(np.int64)


def sum16(head, o: int, n: int):
    """For one's complement sums: a value congruent modulo 0xFFFF to the sum of the n big-endian 16-bit words from
    offset o (n even), zero only where that sum is. It is 256 times the sum of the same bytes as little-endian
    32-bit words (2**16 is 1 modulo 0xFFFF; RFC 1071's byte order independence), added a column at a time (~3
    times cheaper than numpy's sum along the rows)."""
    words = head[:, o:o + 2 * n].view("<u4")
    s = words[:, 0].astype(np.int64)
    for k in range(1, n // 2):
        s += words[:, k]
    return s << 8
