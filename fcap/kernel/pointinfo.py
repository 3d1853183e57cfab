"""What a multi-attach program does differently per point, carried in the attach cookie beside the point id: the
low 32 bits are the point id, the high 32 the point's bits (its packets go out; where its device queue is; it runs
inside a free; which arguments are the skb and the drop reason). So one program serves every point of a kind, at
no cost per packet but a few instructions (the cookie is read once anyway). Declared and read here once: the
cookie's layout, the program's code."""

from __future__ import annotations

from bpf.asm import ADD, AND, FP, JEQ, R0, R1, W, alu64, jmp, ldx, mov, rshi, stx

from fcap.kernel.layout import STACK

OUT = 1          # the point sees packets going out (a transmit point): pkt_type PACKET_OUTGOING, as at one of its own
QUEUE_TX = 2     # skb->queue_mapping is the device queue (fcap.kernel.epbopts.queue_source "tx")
QUEUE_RX = 4     # queue_mapping - 1 when not 0 ("rx")
QUEUE = QUEUE_TX | QUEUE_RX
INSIDE_FREE = 8  # the function runs inside a free, after its tracepoint (fcap.kernel.track.inside_free)
SKB_ARG_SHIFT, SKB_ARG_MASK = 4, 0xF   # which argument is the skb (so one program serves every position)
REASON_SHIFT, REASON_MASK = 8, 0xF     # 1 + which argument is the drop reason (0: none; fcap.kernel.drops)
_QUEUE_BITS = {"tx": QUEUE_TX, "rx": QUEUE_RX, None: 0}


def cookie(point_id: int, direction: str | None, queue: str | None, inside_free: bool = False,
           skb_arg: int = 0, reason_arg: int | None = None) -> int:
    """The attach cookie of a point in a multi-attach link: its id; above, its bits from its direction ("in",
    "out", None), its queue source (fcap.kernel.epbopts.queue_source: "tx", "rx", None), whether it runs inside
    a free, which of its arguments is the skb and which the drop reason (None: none)."""
    if not holds(skb_arg, reason_arg):
        raise ValueError(f"skb argument {skb_arg}, reason argument {reason_arg}: past what the cookie holds")
    reason = 0 if reason_arg is None else reason_arg + 1
    bits = (OUT if direction == "out" else 0) | _QUEUE_BITS[queue] | (INSIDE_FREE if inside_free else 0)
    return point_id | (bits | skb_arg << SKB_ARG_SHIFT | reason << REASON_SHIFT) << 32


def holds(skb_arg: int, reason_arg: int | None) -> bool:
    """Can a cookie name these arguments (the skb's, the drop reason's or None)?"""
    return 0 <= skb_arg <= SKB_ARG_MASK and (reason_arg is None or 0 <= reason_arg < REASON_MASK)


def keep() -> list:
    """After bpf_get_attach_cookie (R0: the cookie): the point id into STACK.key, the bits into STACK.point_bits.
    Uses R1."""
    return [stx(W, FP, STACK.key, R0), mov(R1, R0), rshi(R1, 32), stx(W, FP, STACK.point_bits, R1)]


def skb_arg(dst: int) -> list:
    """dst = which argument is the skb (after keep())."""
    return [ldx(W, dst, FP, STACK.point_bits), rshi(dst, SKB_ARG_SHIFT), alu64(AND, dst, SKB_ARG_MASK)]


def reason_arg(dst: int, none: str) -> list:
    """dst = which argument is the drop reason (after keep()); to `none` where the point has none."""
    return [ldx(W, dst, FP, STACK.point_bits), rshi(dst, REASON_SHIFT), alu64(AND, dst, REASON_MASK),
            jmp(JEQ, dst, 0, none), alu64(ADD, dst, -1)]


def unless(dst: int, mask: int, label: str) -> list:
    """dst = the point's bits & mask; to `label` when none is set."""
    return [ldx(W, dst, FP, STACK.point_bits), alu64(AND, dst, mask), jmp(JEQ, dst, 0, label)]

