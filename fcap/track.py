"""--track: the filter and predicates decide at the first point where a packet passes them; from then on its skb is
captured at every point, without running them, until it is freed (tp_btf/kfree_skb, consume_skb), with the first
skb's address as the packet id at each.

The tracking map (fcap.layout's TRACK, an LRU hash: bounded, the least recently used entries go first) holds two
keys per tracked packet: the skb's address (its value keeps the head the skb had, so that a new skb at a freed one's
address is not taken for it) and its data head's address | 1, through which clones (which share the head) are found
without a hook on skb_clone; a clone found so gets its own skb key. At the free tracepoints the skb key goes, and the
head key too unless the skb is a clone or was cloned. Counters (TRACK_COUNTERS): packets started, clones joined,
entries deleted; with the entries left at the end they give the entries the LRU evicted."""

from __future__ import annotations

from bpf import asm
from bpf.asm import (DW, FP, JEQ, JNE, R0, R1, R2, R3, R4, R6, R7, R8, W, addi, call, exit_, jmp, label, ld_map_fd,
                     ldx, mov, movi, st, stx)
from bpf.btf import BTFError
from bpf.uapi import Helper

from .errors import ProgramError
from .layout import META, STACK, TRACK, TRACK_COUNTERS
from .points import Point

FREE_POINTS = ("kfree_skb", "consume_skb")   # tracepoints: the skb is freed right after them
DEFAULT_MAX = 16384


def is_free_point(p: Point) -> bool:
    return p.kind in ("tp_btf", "raw_tp") and p.name in FREE_POINTS


def _count(b, field: str) -> None:
    """TRACK_COUNTERS[field] += 1 (this CPU's)."""
    done = b.fresh("tc")
    b.emit(st(W, FP, STACK.track_ckey, 0), ld_map_fd(R1, b.m.track_counters), mov(R2, FP),
           addi(R2, STACK.track_ckey), call(Helper.map_lookup_elem), jmp(JEQ, R0, 0, done),
           TRACK_COUNTERS.load(R1, R0, field), addi(R1, 1), TRACK_COUNTERS.store(R0, field, R1), label(done))


def _key(b, reg: int, tag: int = 0) -> None:
    b.emit(stx(DW, FP, STACK.track_key, reg))
    if tag:
        b.emit(ldx(DW, R1, FP, STACK.track_key), asm.alu64(asm.OR, R1, tag), stx(DW, FP, STACK.track_key, R1))


def _insert(b) -> None:
    """map[STACK.track_key] = STACK.track_val (an LRU map makes room: it never refuses for want of it)."""
    b.emit(ld_map_fd(R1, b.m.track), mov(R2, FP), addi(R2, STACK.track_key), mov(R3, FP), addi(R3, STACK.track_val),
           movi(R4, 0), call(Helper.map_update_elem))


def _delete(b) -> None:
    done = b.fresh("td")
    b.emit(ld_map_fd(R1, b.m.track), mov(R2, FP), addi(R2, STACK.track_key), call(Helper.map_delete_elem),
           jmp(JNE, R0, 0, done))
    _count(b, "deleted")
    b.emit(label(done))


def _lookup(b, miss: str) -> None:
    b.emit(ld_map_fd(R1, b.m.track), mov(R2, FP), addi(R2, STACK.track_key), call(Helper.map_lookup_elem),
           jmp(JEQ, R0, 0, miss))


def emit_lookup(b) -> None:
    """Before the predicates: is this skb tracked? STACK.track_id = its packet id (0: no); tracked skbs jump past
    the predicates to "trk_tracked" (emit_tracked_label). R6 skb, R7 scratch; uses R0-R4, R8."""
    if not b.m.track:
        return
    b.emit(st(DW, FP, STACK.track_id, 0))
    b.read(DW, R8, R6, b.f.head)
    _key(b, R6)
    _lookup(b, "trk_by_head")
    b.emit(TRACK.load(R1, R0, "head"), jmp(JNE, R1, R8, "trk_by_head", reg=True),
           TRACK.load(R1, R0, "id"), stx(DW, FP, STACK.track_id, R1), asm.ja("trk_tracked"),
           label("trk_by_head"))
    _key(b, R8, 1)
    _lookup(b, "trk_untracked")
    # a clone of a tracked packet (the same head): tracked under the first skb's id, and by its own address
    b.emit(TRACK.load(R1, R0, "id"), stx(DW, FP, STACK.track_id, R1),
           stx(DW, FP, STACK.track_val + TRACK.off("id"), R1), stx(DW, FP, STACK.track_val + TRACK.off("head"), R8))
    _count(b, "joined")
    _key(b, R6)
    _insert(b)
    b.emit(asm.ja("trk_tracked"), label("trk_untracked"))


def emit_tracked_label(b) -> None:
    """After the predicates: where tracked skbs come in."""
    if b.m.track:
        b.emit(label("trk_tracked"))


def emit_skip_filter(b) -> None:
    """Before the filter: tracked skbs go past it (to emit_filter_done's label)."""
    if b.m.track:
        b.emit(ldx(DW, R0, FP, STACK.track_id), jmp(JNE, R0, 0, "trk_filtered"))


def emit_filter_done(b) -> None:
    """After the filter (the packet will be recorded): a tracked skb's record carries its packet id; an untracked
    one starts being tracked here (not at a free point); at a free point the skb's keys go."""
    if not b.m.track:
        return
    b.emit(label("trk_filtered"), ldx(DW, R1, FP, STACK.track_id), jmp(JEQ, R1, 0, "trk_new"),
           META.store(R7, "skb", R1), asm.ja("trk_free"), label("trk_new"))
    if not is_free_point(b.p):
        b.read(DW, R8, R6, b.f.head)
        b.emit(stx(DW, FP, STACK.track_val + TRACK.off("id"), R6), stx(DW, FP, STACK.track_val + TRACK.off("head"), R8))
        _count(b, "started")
        _key(b, R6)
        _insert(b)
        _key(b, R8, 1)
        _insert(b)
    b.emit(label("trk_free"))
    if is_free_point(b.p):
        emit_untrack(b)


def emit_untrack(b) -> None:
    """The skb (R6) is freed: its key goes, and its head's unless the head is shared (skb->cloned). Uses R0-R4, R8."""
    _key(b, R6)
    _delete(b)
    byte, bit = _cloned_bit(b)
    shared = b.fresh("tshared")
    b.read(asm.B, R8, R6, byte)
    b.emit(asm.rshi(R8, bit), asm.andi(R8, 1), jmp(JNE, R8, 0, shared))
    b.read(DW, R8, R6, b.f.head)
    _key(b, R8, 1)
    _delete(b)
    b.emit(label(shared))


def _cloned_bit(b) -> tuple[int, int]:
    btf = b.p.btf if b.p.btf.base is None else b.p.btf.base
    try:
        _m, bits = btf.find("sk_buff", "struct").member("cloned")
    except (BTFError, AttributeError):
        raise ProgramError("--track: this kernel's struct sk_buff has no 'cloned' bit") from None
    return bits // 8, bits % 8


def untrack_program(b) -> list:
    """A program at a free tracepoint that is not captured: it only forgets the freed skb."""
    b.emit(ldx(DW, R6, R1, 0), jmp(JEQ, R6, 0, "out"))
    emit_untrack(b)
    b.emit(label("out"), movi(R0, 0), exit_())
    return b.items


def evicted(counters, remaining: int) -> int:
    """Entries the LRU evicted: inserted (two per packet, one per clone) - deleted - still there."""
    c = read_counters(counters)
    return max(2 * c["started"] + c["joined"] - c["deleted"] - remaining, 0)


def read_counters(counters) -> dict[str, int]:
    return {n: counters.sum_u64(0, TRACK_COUNTERS.off(n)) for n in ("started", "joined", "deleted")}
