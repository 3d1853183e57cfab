"""The standard pcapng options fcap puts on each packet beside its metadata comment, where Wireshark shows them as
fields: epb_flags (direction: frame.packet_flags_direction), epb_packetid (the packet id, fcap.kernel.track:
frame.packet_id), epb_queue (the device queue: frame.interface_queue), epb_verdict at drop points (TC_ACT_SHOT:
frame.verdict.ebpf_tc), and at a BPF program's exit its own verdict (fcap.kernel.verdicts). Which a point gets and
their values, for the blocks user space lays out (fcap.features.notes.RecordNotes) and for those the capture program
lays out (fcap.kernel.ringrec), decided here once."""

from __future__ import annotations

from bpf.asm import H, JEQ, OR, R0, R6, R7, R8, addi, alu64, jmp, label

from fcap.kernel import drops, pointinfo
from fcap.kernel.parts import RECORD_META, Part
from fcap.kernel.layout import FLAG_QUEUE, META
from fcap.files.pcapfile import VERDICT_TC
from fcap.points.spec import Point, is_device_point

TC_ACT_SHOT = 2
DROP_VERDICT = (VERDICT_TC, TC_ACT_SHOT)    # "the kernel dropped it": Wireshark shows eBPF TC: TC_ACT_SHOT (2)
# Device-layer transmit points where the queue is not picked yet (fentry at the entry of dev_queue_xmit)
_BEFORE_PICK = frozenset(("dev_queue_xmit", "__dev_queue_xmit"))


def verdict(point: Point) -> tuple | None:
    """epb_verdict for every packet of this point: DROP_VERDICT at drop points, else None."""
    return DROP_VERDICT if drops.drops_every_packet(point.name) else None


def queue_source(point: Point) -> str | None:
    """Where the point's packets have a device queue: "tx" (skb->queue_mapping, picked at a device-layer
    transmit point), "rx" (queue_mapping - 1 when a driver recorded one, at a device-layer receive point), or
    None (no queue meant there: none is written)."""
    if not is_device_point(point.name) or point.kind.on_program:
        return None
    if point.direction == "out" and not (point.name in _BEFORE_PICK and point.kind.at_entry):
        return "tx"
    return "rx" if point.direction == "in" else None


def emit_queue(b) -> None:
    """In the capture program (after the metadata): META's queue and FLAG_QUEUE where the point has a queue (a
    multi-attach program: where the point's bits say so, fcap.kernel.pointinfo). Uses R0, R8."""
    multi = b.point.kind.multi
    source = None if multi else queue_source(b.point)
    done = b.fresh("queue_done")
    if multi:
        b.emit(pointinfo.unless(R0, pointinfo.QUEUE, done))
    b.read(H, R8, R6, b.offsets.queue_mapping)          # R6: the skb, R7: META
    if multi:   # rx as below, where the bits say so
        tx = b.fresh("queue_tx")
        b.emit(pointinfo.unless(R0, pointinfo.QUEUE_RX, tx), jmp(JEQ, R8, 0, done), addi(R8, -1), label(tx))
    if source == "rx":   # skb_get_rx_queue(): recorded as queue + 1, 0 when no driver recorded one
        b.emit(jmp(JEQ, R8, 0, done), addi(R8, -1))
    b.emit(META.store(R7, "queue", R8), META.load(R0, R7, "flags"), alu64(OR, R0, FLAG_QUEUE),
           META.store(R7, "flags", R0), label(done))


QUEUE = Part("queue", on=lambda point, options, maps: options.meta and (point.kind.multi or
                                                                           queue_source(point) is not None),
                stages={RECORD_META: emit_queue}, fields=("queue",), flags=(FLAG_QUEUE,),
                reads="fcap.features.notes.RecordNotes")


def queue_always(point: Point, options, maps) -> bool:
    """Whether every record of the program has a queue (QUEUE on, FLAG_QUEUE set without a condition): a transmit
    point's, not a multi-attach program's."""
    return QUEUE.on(point, options, maps) and not point.kind.multi and queue_source(point) == "tx"
