"""An untyped program's copy of the sk_buff: the members it reads (len, protocol, dev, head, data, ...) taken with
one bpf_probe_read_kernel when the program starts, then read with plain loads (a probe_read each cost ~1.4–3.2 µs a
rejected packet under TCG with every skb function attached)."""

from __future__ import annotations

from bpf.asm import R1, R2, R3, SIZE_BYTES, Label, addi, call, ldx, mov, movi
from bpf.uapi import Helper

from fcap.kernel.layout import SKB_SNAP, SKB_SNAP_MAX


class Snapshot:
    """The range of struct sk_buff a program reads, grown as its code is made: the loads are plain loads from the
    scratch value (SKB_SNAP: the struct's bytes at their own offsets), the one read that fills the range goes in
    at a mark near the start (place), once the whole program is made and the range known."""

    def __init__(self):
        self.lo = self.hi = None   # [lo, hi): the bytes of struct sk_buff the program's loads read
        self.loads = 0             # loads made so far
        self._marks: list[tuple[int, int]] = []   # (where in the program's items, loads made before it)

    @staticmethod
    def covers(size: int, off: int) -> bool:
        """Does the copy hold the `size` bytes at offset `off` (within what the scratch value reserves for it)?"""
        return 0 <= off and off + SIZE_BYTES[size] <= SKB_SNAP_MAX

    def load(self, size: int, dst: int, meta: int, off: int):
        """dst = the skb's member of `size` at `off` (covers() must hold), from the copy; `meta` holds META's
        address (the scratch value past the dump area)."""
        end = off + SIZE_BYTES[size]
        self.loads += 1
        self.lo = off if self.lo is None else min(self.lo, off)
        self.hi = end if self.hi is None else max(self.hi, end)
        return ldx(size, dst, meta, SKB_SNAP + off)

    def mark(self, items: list) -> None:
        """A place the copy may go, at the end of the program's items so far (R6 the skb, R7 META, R0-R5 free)."""
        self._marks.append((len(items), self.loads))
        items.append(None)

    def place(self, items: list, meta: int, skb: int) -> None:
        """The copy (take) in at the last mark that nothing before it loaded from and that the code since the first
        mark jumps past only to "out" (a predicate that turns a packet away without reading the skb, --pid, costs
        no copy); the other marks out."""
        first = at = self._marks[0][0]
        for pos, loads in self._marks[1:]:
            code = items[first:pos]
            inside = {i.name for i in code if isinstance(i, Label)}
            if loads or any(getattr(i, "target", None) not in (None, "out", *inside) for i in code):
                break
            at = pos
        for pos, _loads in reversed(self._marks):
            items[pos:pos + 1] = self.take(meta, skb) if pos == at else []

    def take(self, meta: int, skb: int) -> list:
        """The copy of [lo, hi) from the skb (register `skb`) into the scratch value (`meta`: META's address);
        nothing when nothing is read from it. A read that fails leaves zeros (bpf_probe_read_kernel clears its
        destination), as each member's read did. Uses R0-R5."""
        if self.lo is None:
            return []
        assert self.hi <= SKB_SNAP_MAX
        return [mov(R1, meta), addi(R1, SKB_SNAP + self.lo), movi(R2, self.hi - self.lo), mov(R3, skb),
                addi(R3, self.lo), call(Helper.probe_read_kernel)]
