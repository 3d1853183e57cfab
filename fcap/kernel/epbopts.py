"""The standard pcapng options fcap puts on each packet beside its metadata comment, where Wireshark shows them as
fields: epb_flags (direction: frame.packet_flags_direction), epb_packetid (the packet id, fcap.kernel.track:
frame.packet_id), epb_queue (the device queue: frame.interface_queue), epb_verdict at drop points (TC_ACT_SHOT:
frame.verdict.ebpf_tc), and at a BPF program's exit its own verdict (fcap.kernel.verdicts). Which a point gets and
their values, for the blocks user space lays out (EpbOptions) and for those the capture program lays out
(fcap.kernel.ringrec), decided here once."""

from __future__ import annotations

from bpf.asm import H, JEQ, OR, R0, R6, R7, R8, addi, alu64, jmp, label

from fcap.kernel import drops, kstack, pointinfo, verdicts
from fcap.kernel.feature import RECORD_META, Feature
from fcap.kernel.layout import EPB_DIRECTION, FLAG_QUEUE, META, format_comment
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
    vm = b.point.btf if b.point.btf.base is None else b.point.btf.base
    _m, bits = vm.find("sk_buff", "struct").member("queue_mapping")
    done = b.fresh("queue_done")
    if multi:
        b.emit(pointinfo.unless(R0, pointinfo.QUEUE, done))
    b.read(H, R8, R6, bits // 8)          # R6: the skb, R7: META
    if multi:   # rx as below, where the bits say so
        tx = b.fresh("queue_tx")
        b.emit(pointinfo.unless(R0, pointinfo.QUEUE_RX, tx), jmp(JEQ, R8, 0, done), addi(R8, -1), label(tx))
    if source == "rx":   # skb_get_rx_queue(): recorded as queue + 1, 0 when no driver recorded one
        b.emit(jmp(JEQ, R8, 0, done), addi(R8, -1))
    b.emit(META.store(R7, "queue", R8), META.load(R0, R7, "flags"), alu64(OR, R0, FLAG_QUEUE),
           META.store(R7, "flags", R0), label(done))


QUEUE = Feature("queue", on=lambda point, options, maps: options.meta and (point.kind.multi or
                                                                           queue_source(point) is not None),
                stages={RECORD_META: emit_queue}, fields=("queue",), flags=(FLAG_QUEUE,),
                reads="fcap.kernel.epbopts.EpbOptions")


def queue_always(point: Point, options, maps) -> bool:
    """Whether every record of the program has a queue (QUEUE on, FLAG_QUEUE set without a condition): a transmit
    point's, not a multi-attach program's."""
    return QUEUE.on(point, options, maps) and not point.kind.multi and queue_source(point) == "tx"


class EpbOptions:
    """A block's options (keyword arguments of PcapngWriter.write and epb_parts) for a record whose block user
    space lays out: the same as the capture program writes into the file rings. At drop points the comment also
    says why and where the packet was dropped, and with --nft (`nft`: the session's fcap.host.nftrace.Tracer, the
    records' link type number `linktype`) which nftables rule dropped a packet netfilter dropped; with --stack it
    ends with the kernel stack (fcap.kernel.kstack)."""

    def __init__(self, points: list[Point], context: bool = False, nft=None, linktype: int = 0,
                 comment: bool = True):
        from fcap.host.ctxnames import Context
        self.context = Context() if context else None   # --context: the cgroup's path, container, netns name
        self.nft, self.linktype = nft, linktype
        self.comment = comment                           # (--no-comment: records without one)
        self._nft_last: tuple = (None, {})               # (record, its nft values): each record matched once
        self.flags = {p.id: EPB_DIRECTION.get(p.direction) for p in points}
        self.verdicts = {p.id: verdict(p) for p in points}
        self.decided = {p.id: p for p in points if verdicts.records_verdict(p)}   # each record's own verdict
        self.drop_points = {p.id: drops.reason_arg(p) is not None for p in points if drops.is_drop_point(p)}
        self.drop_names = drops.Names() if self.drop_points else None

    def __call__(self, rec) -> dict:
        comment = (format_comment(rec) + self.context_text(rec) + self.drop_text(rec) + self.nft_text(rec)
                   + self.verdict_text(rec) + kstack.text(rec.stack)) if self.comment else None
        return {"flags": self.flags.get(rec.point), "comment": comment,
                "packet_id": rec.id, "queue": rec.queue, "verdict": self.verdict(rec)}

    def verdict(self, rec) -> tuple | None:
        """epb_verdict (type, value) of a record: the program's return value at a BPF program's exit, the drop
        points' constant, else None."""
        p = self.decided.get(rec.point)
        return (verdicts.verdict_type(p), rec.retval) if p is not None else self.verdicts.get(rec.point)

    def verdict_text(self, rec) -> str:
        """' verdict=XDP_DROP' at a BPF program's exit, else ''."""
        p = self.decided.get(rec.point)
        return f"{verdicts.VERDICT_COMMENT[0][0]}{verdicts.name(p, rec.retval)}" if p is not None else ""

    def context_text(self, rec) -> str:
        """' cgroup=ID cgroup_path=P ...' (fcap.host.ctxnames.CONTEXT_COMMENT) with --context, else ''."""
        return self.context.text(rec) if self.context is not None else ""

    def context_values(self, rec) -> dict:
        """{Packet attribute: value} of the context with --context, else {}."""
        return self.context.values(rec) if self.context is not None else {}

    def drop_text(self, rec) -> str:
        """' reason=NO_SOCKET at=FUNC+0xOFF' for a record of a drop point, else ''."""
        if rec.point not in self.drop_points:
            return ""
        return self.drop_names.text(rec, self.drop_points[rec.point])

    def nft_values(self, rec) -> dict:
        """{Packet attribute: value} of the nftables rule that dropped a netfilter drop's packet (--nft), else {}."""
        if self.nft is None or rec.point not in self.drop_points:
            return {}
        last, values = self._nft_last
        if last is not rec:
            from fcap.host import nftrace
            reason, location = self.drop(rec)
            values = {}
            if nftrace.is_netfilter_drop(reason, location):
                d = self.nft.attribute(nftrace.network_bytes(bytes(rec.data), self.linktype), rec.mark, rec.ts_ns)
                values = d.values() if d is not None else {}
            self._nft_last = (rec, values)
        return values

    def nft_text(self, rec) -> str:
        """' nft_family=inet nft_table=T nft_chain=C nft_rule=H' (fcap.host.nftrace.NFT_COMMENT), else ''."""
        if self.nft is None:
            return ""
        from fcap.host import nftrace
        return nftrace.text(self.nft_values(rec))

    def drop(self, rec) -> tuple:
        """(reason name or None, location) of a record of a drop point; (None, None) elsewhere."""
        if rec.point not in self.drop_points:
            return None, None
        names = self.drop_names
        return (names.reason(rec.reason) if self.drop_points[rec.point] else None), names.location(rec.location)

