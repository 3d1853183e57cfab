"""The file ring: per-CPU byte streams of finished capture file records, written by the capture program itself
(pcap records; pcapng Enhanced Packet Blocks with their options and the metadata comment, see fcap.kernel.kcomment), so
that user space only writes the bytes out. The ring's layout is fcap.kernel.layout's RING."""

from __future__ import annotations

import platform
from typing import Callable, NamedTuple

from bpf import asm
from bpf.asm import (ADD, AND, DIV, DW, FP, JEQ, JGE, JGT, JLE, JLT, JNE, JSGT, JSLT, MUL, OR, R0, R1, R2, R3, R4, R5,
                     R6, R7, R8, R9, SUB, W, addi, alu64, andi, call, ja, label, ld_imm64, ld_map_fd, ldx, mov, movi,
                     lshi, rshi, st, stx)
from bpf import probes
from bpf.uapi import F_CURRENT_CPU, Helper

from fcap.kernel import epbopts

from fcap.kernel import drops, kcomment, track
from fcap.kernel.parts import WRITE, Part, MapUse
from fcap.kernel.progopts import dump_area
from fcap.kernel.layout import (EPB_DIRECTION, EPB_HDR, EPB_REC, FLAG_QUEUE, HDR_MAX, HEAD_BITS, HEAD_COUNT, HEAD_ONE,
                     HEAD_POS, ID_CPU_BITS, META, PCAP_HDR, PCAP_REC, PCAPNG_COMMENT, PCAPNG_EPB, PCAPNG_FLAGS,
                     PCAPNG_OPTIONS, PCAPNG_PACKETID, PCAPNG_QUEUE, PCAPNG_VERDICT, PKT, RECORD_PCAPNG, RING,
                     RING_CAPLEN_MAX, RING_COPY_MAX, RING_CTRL, RING_INDEX, RING_INDEX_BYTES, STACK, TEXT_MAX, CTX_KEY,
                     CTX_MAX, CTX_TEXT, DUMP_OPTS_MAX, DUMP_TEXT, DUMP_TEXT_KEY, DROP_MAX, DROP_TEXT, DROP_TEXT_KEY,
                     NFT_MAX, NFT_TEXT, NFT_TEXT_KEY, STK_KEY, STK_MAX, STK_TEXT, Layout)
from fcap.kernel.layout import COPY_MAX as SAMPLE_COPY_MAX   # what a perf sample holds
from fcap.defaults import NS
from fcap.files.pcapfile import verdict_value

assert PCAPNG_OPTIONS == (PCAPNG_FLAGS, PCAPNG_PACKETID, PCAPNG_QUEUE, PCAPNG_VERDICT, PCAPNG_COMMENT), \
    "_options writes the options in this order"

CAPLEN_MAX, COPY_MAX = RING_CAPLEN_MAX, RING_COPY_MAX   # a record holds a whole GSO/BIG TCP skb up to these

SMALL_COPY = 256          # linear packets up to this long are copied by direct loads where the verifier allows
SPILL = TEXT_MAX + 8     # the comment is copied with fixed-size stores: this far past its start gets written
CTX_SPILL = SPILL + CTX_MAX   # ... and --context's text after it (fcap.kernel.layout's CTX_TEXT; the other texts user
#                               space gives, GIVEN's, are copied as long as they are)
QUEUE_OPT, VERDICT_OPT = 8, 16   # epb_queue (u32), epb_verdict (type + 8 bytes, padded)
OPTS_MAX = (8 + 12 + QUEUE_OPT + VERDICT_OPT + 4 + TEXT_MAX + CTX_MAX + DROP_MAX + NFT_MAX + STK_MAX + 4 + 4
            + DUMP_OPTS_MAX)
REC_MAX = EPB_HDR + CAPLEN_MAX + 3 + OPTS_MAX
RING_SLACK = (REC_MAX + CTX_SPILL + 4095) & ~4095
PCAP_AT, EPB_AT = RING_CTRL - PCAP_REC, RING_CTRL - EPB_REC   # META's record header fields -> the ring's copy
assert RING_INDEX.size == 1 << 4, "_publish finds an index entry by a shift"


def index_at(ring_size: int) -> int:
    """Where a CPU's index of records starts in its element (fcap.kernel.layout's RING_INDEX)."""
    return RING_CTRL + ring_size + RING_SLACK


def index_entries(ring_size: int) -> int:
    return ring_size // RING_INDEX_BYTES


def element_size(ring_size: int) -> int:
    """Bytes of each CPU's element: control words, ring, slack, index."""
    return index_at(ring_size) + index_entries(ring_size) * RING_INDEX.size


def emit(b) -> None:
    """The record into this CPU's file ring. In: R2 = copy, R8 = hdr_total (<= HDR_MAX), R7 scratch, R6 skb.
    Out: R0 = 0, or -1 when the record was dropped (no room, a nested writer, a failed read)."""
    r = b.fresh_names("r", "copied", "count", "done", "fail", "frags", "in_order", "link_done", "noq", "opt_noq",
                      "orig", "perf", "pos", "probe", "publish", "sample", "sec", "sec_set", "unlock", "words",
                      "ctx_hit", "ctx_miss")
    if names_context(b):
        _context(b, r)
    for g in givens(b):
        _look_up(b, r, g)
    if gives_dumps(b):
        _look_up(b, r, DUMP_OPTIONS)
    if frags_by_perf(b.maps):
        _frags_to_perf(b, r)
    # n = bytes from the skb (from offset skip), caplen = hdr + n
    b.emit(META.load(R3, R7, "skip"), mov(R4, R2), alu64(SUB, R4, R3, reg=True),
           asm.jmp(JSGT, R4, 0, r.pos), movi(R4, 0), label(r.pos),
           asm.jmp(JGT, R4, COPY_MAX, r.fail), stx(DW, FP, STACK.n, R4),
           alu64(ADD, R4, R8, reg=True), META.store(R7, "caplen", R4))
    if b.options.record == RECORD_PCAPNG:
        _pcapng(b, r)
    else:
        _pcap(b, r)


def frags_by_perf(maps) -> bool:
    """Whether the records of packets whose bytes reach into page frags go through the perf buffer (maps.frags, with
    bpf_skb_output appending the frags) rather than the ring: a kernel without skb dynptrs in tracing programs
    (before 6.12). The rest, linear, still go to the ring."""
    return bool(maps.ring and not maps.dynptr_kfunc)


def names_context(b) -> bool:
    """Whether the comment ends with --context's names, which user space gives the program in a map (maps.ctxtext:
    layout.CTX_KEY -> CTX_TEXT, fcap.features.packet_context fills it); the records of a key it lacks go through
    the perf buffer (maps.frags), where user space names them."""
    return _given(b, b.maps.ctxtext)


def _given(b, texts: int) -> bool:
    return bool(b.maps.ring and texts and b.maps.frags and b.options.record == RECORD_PCAPNG and b.options.comment)


class Given(NamedTuple):
    """A text user space gives the programs once for good, from a map of its own (Maps' attribute `map`: key ->
    `value`, whose len and text the program copies, as long as it is, into the comment): the records whose key the
    map lacks go through the perf buffer (maps.frags), where user space names them and fills the map."""

    map: str
    value: Layout
    val: int                     # the stack slots of the value found and its length
    len: int
    key: Callable                # b -> the instructions that store the key at STACK.given_key (R0 free)
    on: Callable                 # b -> whether the program writes it (a map given, the point's)


def _frames_key(b) -> list:
    return [META.load(R0, R7, "stack"), STK_KEY.store(FP, "id", R0, STACK.given_key)]


def _drop_key(b) -> list:
    named = int(drops.reason_arg(b.point) is not None)
    return [META.load(R0, R7, "reason"), DROP_TEXT_KEY.store(FP, "reason", R0, STACK.given_key),
            DROP_TEXT_KEY.store_imm(FP, "named", named, STACK.given_key), META.load(R0, R7, "location"),
            DROP_TEXT_KEY.store(FP, "location", R0, STACK.given_key)]


def _nft_key(b) -> list:
    return [META.load(R0, R7, "nft"), NFT_TEXT_KEY.store(FP, "rule", R0, STACK.given_key)]


# in the comment's order (fcap.features.FEATURES'), after the metadata's text and --context's names
GIVEN = (Given("droptext", DROP_TEXT, STACK.drop_val, STACK.drop_len, _drop_key,
               lambda b: _given(b, b.maps.droptext) and drops.is_drop_point(b.point)),
         Given("nfttext", NFT_TEXT, STACK.nft_val, STACK.nft_len, _nft_key,   # (key 0, no rule: the empty text)
               lambda b: _given(b, b.maps.nfttext) and drops.is_drop_point(b.point)),
         Given("stktext", STK_TEXT, STACK.stk_val, STACK.stk_len, _frames_key, lambda b: _given(b, b.maps.stktext)))
assert all(g.value.off("len") == 0 for g in GIVEN)


def give(texts, key: bytes, value: Layout, text: str | bytes) -> bool:
    """User space's half of a Given: `text` under `key` in `texts`, its map (value: len, text); False where it is
    too long for the programs or the map is full (its records go on through the perf buffer, named there)."""
    data = text.encode() if isinstance(text, str) else text
    if len(data) > value.width("text"):
        return False
    try:
        texts.update(key, value.struct.pack(len(data), data))
    except OSError:
        return False
    return True


# --dump's options (comments and custom options, fcap.kernel.dumps.GivenOptions) by the hash of the record's dumps:
# not in the comment, after it
DUMP_OPTIONS = Given("dumptext", DUMP_TEXT, STACK.dump_val, STACK.dump_len,
                     lambda b: [META.load(R0, R7, "dumps"), DUMP_TEXT_KEY.store(FP, "hash", R0, STACK.given_key)],
                     lambda b: _given(b, b.maps.dumptext))


def gives_dumps(b) -> bool:
    """Whether the records' options end with their dumps', which user space gives the program (maps.dumptext)."""
    return DUMP_OPTIONS.on(b)


def givens(b) -> list[Given]:
    """The texts user space gives this program (a drop's names; --stack's frames, fcap.kernel.kstack.Stacks)."""
    return [g for g in GIVEN if g.on(b)]


def _look_up(b, r, g: Given) -> None:
    """g.val: the text user space gave for this record's key, and its length at g.len; none yet, or too long: on to
    r.perf. In and out: R2 = copy (kept across the lookup)."""
    miss, hit = b.fresh("given_miss"), b.fresh("given_hit")
    b.emit(stx(DW, FP, STACK.ctx_copy, R2), g.key(b),
           ld_map_fd(R1, getattr(b.maps, g.map)), mov(R2, FP), addi(R2, STACK.given_key), call(Helper.map_lookup_elem),
           asm.jmp(JEQ, R0, 0, miss),
           g.value.load(R1, R0, "len"), asm.jmp(JGT, R1, _most(g), miss), stx(DW, FP, g.len, R1),
           stx(DW, FP, g.val, R0), ldx(DW, R2, FP, STACK.ctx_copy), ja(hit),
           label(miss), ldx(DW, R2, FP, STACK.ctx_copy), ja(r.perf), label(hit))


def _most(g: Given) -> int:
    return g.value.width("text")


def _context(b, r) -> None:
    """STACK.ctx_val: the names user space gave this packet's (cgroup, netns), and their length at STACK.ctx_len;
    none yet, longer than CTX_MAX or expired: on to r.perf. In and out: R2 = copy (kept across the lookup)."""
    b.emit(stx(DW, FP, STACK.ctx_copy, R2), META.load(R0, R7, "cgroup"), CTX_KEY.store(FP, "cgroup", R0, STACK.ctx_key),
           META.load(R0, R7, "netns"), CTX_KEY.store(FP, "netns", R0, STACK.ctx_key),
           ld_map_fd(R1, b.maps.ctxtext), mov(R2, FP), addi(R2, STACK.ctx_key), call(Helper.map_lookup_elem),
           asm.jmp(JEQ, R0, 0, r.ctx_miss),
           CTX_TEXT.load(R1, R0, "len"), asm.jmp(JGT, R1, CTX_MAX, r.ctx_miss), stx(DW, FP, STACK.ctx_len, R1),
           CTX_TEXT.load(R1, R0, "expires"), META.load(R3, R7, "ts"), asm.jmp(JGE, R3, R1, r.ctx_miss, reg=True),
           stx(DW, FP, STACK.ctx_val, R0), ldx(DW, R2, FP, STACK.ctx_copy), ja(r.ctx_hit),
           label(r.ctx_miss), ldx(DW, R2, FP, STACK.ctx_copy), ja(r.perf), label(r.ctx_hit))


def can_publish() -> bool:
    """Whether the programs can publish a ring's records, the stores of a record before its head: by a store-release
    (6.15+), an add that fetches (5.12+, fully ordered), or on x86-64 the old XADD (a locked instruction there;
    elsewhere it orders nothing, and the records go through the perf buffer)."""
    return probes.store_release() is None or probes.atomic_fetch() is None or platform.machine() == "x86_64"


def _frags_to_perf(b, r) -> None:
    """Leave for r.perf when the packet's bytes from skip go past its linear part (no skb dynptr to read them from
    the ring's program). In: R2 = copy (kept)."""
    b.emit(META.load(R3, R7, "skip"), mov(R4, R2), alu64(SUB, R4, R3, reg=True), META.load(R0, R7, "len"),
           ldx(W, R5, R6, b.offsets.data_len), alu64(SUB, R0, R5, reg=True), alu64(SUB, R0, R3, reg=True),
           asm.jmp(JSGT, R4, R0, r.perf, reg=True))


def writes_ring(point, options, maps) -> bool:
    """The records go into the file rings (the session made them: BTF-typed points only) rather than the perf
    buffer."""
    return bool(point.typed and maps.ring)


FILE_RING = Part("file ring", on=writes_ring, stages={WRITE: emit}, fields=("caplen",),
                    layouts=("RING", "RING_INDEX"),
                    maps=(MapUse("ring", "mmapable ARRAY, an element (RING, the ring, RING_INDEX) per possible CPU; "
                                         "the session's"),
                          MapUse("events", "PERF_EVENT_ARRAY: the doorbell that wakes user space; the session's"),
                          MapUse("frags", "PERF_EVENT_ARRAY: the records the rings cannot take (bytes in frags without "
                                          "skb dynptrs, texts user space has not given yet); the session's"),
                          MapUse("ctxtext", "HASH, CTX_KEY -> CTX_TEXT: --context's names, given by user space "
                                            "(fcap.features.packet_context); the session's"),
                          MapUse("stktext", "HASH, STK_KEY -> STK_TEXT: --stack's frames, given by user space "
                                            "(fcap.kernel.kstack.Stacks); the session's"),
                          MapUse("droptext", "HASH, DROP_TEXT_KEY -> DROP_TEXT: a drop's names, given by user space "
                                             "(fcap.features.drop_reason); the session's"),
                          MapUse("nfttext", "HASH, NFT_TEXT_KEY -> NFT_TEXT: --nft's rules, given by user space "
                                            "(fcap.kernel.nftfilter.Rules); the session's"),
                          MapUse("dumptext", "HASH, DUMP_TEXT_KEY -> DUMP_TEXT: --dump's options, given by user "
                                             "space (fcap.kernel.dumps.GivenOptions); the session's")),
                    reads="fcap.live.ringdrain.RingDrain")


def _ring_pcapng(point, options, maps) -> bool:
    return writes_ring(point, options, maps) and options.record == RECORD_PCAPNG


def _ring_comment(point, options, maps) -> bool:
    return _ring_pcapng(point, options, maps) and options.comment


# what the file ring's pcapng blocks carry, laid out by the program itself (user space makes both for the other
# records: fcap.kernel.layout.format_comment, fcap.features.notes.RecordNotes)
COMMENT = Part("comment", on=_ring_comment, layouts=("CAREA", "COMMENT"), within="file ring")
EPB_OPTIONS = Part("epb options", on=_ring_pcapng, within="file ring")


def _pcap(b, r) -> None:
    b.emit(META.load(R4, R7, "caplen"), addi(R4, PCAP_HDR), stx(DW, FP, STACK.ring_len, R4))
    _reserve(b, r, 0)
    # the record header in place (R1 + RING_CTRL), laid out as META's: ts_sec, ts_nsec (wall clock), caplen, len
    # (the second cached in the ring's control words: one division per second, not per packet)
    b.emit(META.load(R0, R7, "ts"), ld_imm64(R3, b.options.clock_offset_ns), alu64(ADD, R0, R3, reg=True),
           RING.load(R3, R9, "sec_ns"), mov(R5, R0), alu64(SUB, R5, R3, reg=True), asm.jmp(JGE, R5, NS, r.sec),
           RING.load(R3, R9, "sec"), ja(r.sec_set),
           label(r.sec), mov(R3, R0), alu64(DIV, R3, NS), RING.store(R9, "sec", R3), mov(R5, R3),
           alu64(MUL, R5, NS), RING.store(R9, "sec_ns", R5), alu64(SUB, R0, R5, reg=True), mov(R5, R0),
           label(r.sec_set), META.store(R1, "ts1", R3, PCAP_AT), META.store(R1, "ts2", R5, PCAP_AT),
           META.load(R0, R7, "caplen"), META.store(R1, "caplen", R0, PCAP_AT))
    _orig_len(b, r)
    b.emit(META.store(R1, "orig", R5, PCAP_AT))
    _bytes(b, r, PCAP_HDR)
    _publish(b, r)


def _pcapng(b, r) -> None:
    text = kcomment.text_offset(b.maps.scratch_size, dump_area(b.options))
    flags = EPB_DIRECTION.get(b.point.direction)
    verdict = epbopts.verdict(b.point)
    queue = epbopts.queue_always(b.point, b.options, b.maps)   # (else where FLAG_QUEUE says)
    opts = (8 if flags else 0) + 12 + (QUEUE_OPT if queue else 0) + (VERDICT_OPT if verdict else 0) + 4
    if b.options.comment:
        kcomment.emit(b, text, r.fail)
    # length: 28 + caplen padded to 4 + flags + packet id (+ queue) (+ verdict) (+ comment header + text padded
    # to 4) + end + trailer
    b.emit(META.load(R4, R7, "caplen"), addi(R4, EPB_HDR + 3 + opts), andi(R4, -4))
    if b.options.comment:
        b.emit(ldx(DW, R5, FP, STACK.text_len))
        if names_context(b):
            b.emit(ldx(DW, R0, FP, STACK.ctx_len), alu64(ADD, R5, R0, reg=True))
        for g in givens(b):
            b.emit(ldx(DW, R0, FP, g.len), alu64(ADD, R5, R0, reg=True))
        b.emit(addi(R5, 3 + 8), andi(R5, -4), alu64(ADD, R4, R5, reg=True))
        if gives_dumps(b):   # (padded by user space)
            b.emit(ldx(DW, R5, FP, STACK.dump_len), alu64(ADD, R4, R5, reg=True))
    else:
        b.emit(addi(R4, 4))
    if not queue:
        b.emit(META.load(R5, R7, "flags"), andi(R5, FLAG_QUEUE), asm.jmp(JEQ, R5, 0, r.noq), addi(R4, QUEUE_OPT),
               label(r.noq))
    b.emit(stx(DW, FP, STACK.ring_len, R4))
    _reserve(b, r, CTX_SPILL if names_context(b) else SPILL)
    if track.in_ring(b.point, b.options, b.maps):
        _take_id(b)
    # the block's header in place (R1 + RING_CTRL), laid out as META's: two fields a store (fewer stores to fresh
    # lines of the ring)
    b.emit(ldx(DW, R0, FP, STACK.ring_len), lshi(R0, 32), alu64(OR, R0, PCAPNG_EPB), _pair("btype", "total", R0),
           b.point_id(R3), META.load(R0, R7, "ts"), ld_imm64(R5, b.options.clock_offset_ns),
           alu64(ADD, R0, R5, reg=True), mov(R5, R0), rshi(R5, 32), lshi(R5, 32), alu64(OR, R5, R3, reg=True),
           _pair("iface", "ts1", R5), asm.mov32(R0, R0), META.load(R3, R7, "caplen"), lshi(R3, 32),
           alu64(OR, R0, R3, reg=True), _pair("ts2", "caplen", R0))
    _orig_len(b, r)
    b.emit(META.store(R1, "orig", R5, EPB_AT))
    _bytes(b, r, EPB_HDR)
    _options(b, r, flags, queue, verdict, text)
    _publish(b, r)


def _options(b, r, flags: int | None, queue: bool, verdict: tuple | None, text: int) -> None:
    """The EPB's options after the bytes padded to 4, in PCAPNG_OPTIONS' order: flags, packet id, queue (`queue`:
    always, else when FLAG_QUEUE), verdict, comment (unless --no-comment); end of options and trailer."""
    c = RING_CTRL
    # R1 = record start + caplen padded (options at R1 + c + 28)
    b.emit(ldx(DW, R1, FP, STACK.ring_off), asm.jmp(JGT, R1, b.maps.ring_size - 1, r.unlock),
           alu64(ADD, R1, R9, reg=True), META.load(R2, R7, "caplen"), asm.jmp(JGT, R2, CAPLEN_MAX, r.unlock),
           mov(R3, R1), alu64(ADD, R3, R2, reg=True), st(W, R3, c + EPB_HDR, 0),    # the padding's zeros
           addi(R2, 3), andi(R2, -4), alu64(ADD, R1, R2, reg=True))
    k = c + EPB_HDR
    # each option's code and length in one 32-bit store, with a value of 4 bytes in one 64-bit store
    if flags:
        b.emit(ld_imm64(R0, flags << 32 | _opt(PCAPNG_FLAGS, 4)), stx(DW, R1, k, R0))
        k += 8
    b.emit(st(W, R1, k, _opt(PCAPNG_PACKETID, 8)), META.load(R0, R7, "id"), stx(DW, R1, k + 4, R0))
    k += 12
    value = [META.load(R0, R7, "queue"), lshi(R0, 32), alu64(OR, R0, _opt(PCAPNG_QUEUE, 4)), stx(DW, R1, k, R0)]
    if queue:
        b.emit(value)
        k += QUEUE_OPT
    else:
        b.emit(META.load(R0, R7, "flags"), andi(R0, FLAG_QUEUE), asm.jmp(JEQ, R0, 0, r.opt_noq), value,
               addi(R1, QUEUE_OPT), label(r.opt_noq))
    if verdict:   # a constant: its value and padding as 32-bit stores
        value = verdict_value(*verdict)
        padded = value + bytes(VERDICT_OPT - 4 - len(value))
        b.emit(st(W, R1, k, _opt(PCAPNG_VERDICT, len(value))))
        for j in range(0, len(padded), 4):
            word = int.from_bytes(padded[j:j + 4], "little")
            b.emit(st(W, R1, k + 4 + j, word - (1 << 32) if word >> 31 else word))
        k += VERDICT_OPT
    if not b.options.comment:   # end of options, trailer
        b.emit(ldx(DW, R0, FP, STACK.ring_len), lshi(R0, 32), stx(DW, R1, k, R0))
        return
    _comment_len(b, r, R2, R0)   # (the comment: the metadata's text, then the names', then the texts given)
    b.emit(mov(R0, R2), lshi(R0, 16), alu64(OR, R0, PCAPNG_COMMENT), stx(W, R1, k, R0))
    for j in range(0, TEXT_MAX, 8):
        b.emit(ldx(DW, R0, R7, text + j), stx(DW, R1, k + 4 + j, R0))
    if names_context(b):
        b.emit(ldx(DW, R3, FP, STACK.text_len), asm.jmp(JGT, R3, TEXT_MAX, r.unlock), alu64(ADD, R3, R1, reg=True),
               ldx(DW, R4, FP, STACK.ctx_val))
        for j in range(0, CTX_MAX, 8):
            b.emit(ldx(DW, R0, R4, CTX_TEXT.off("text") + j), stx(DW, R3, k + 4 + j, R0))
    for i, g in enumerate(givens(b)):
        _copy_given(b, r, k + 4, i, g)
    b.emit(mov(R3, R1), alu64(ADD, R3, R2, reg=True), st(W, R3, k + 4, 0),             # the text's padding
           addi(R2, 3), andi(R2, -4), alu64(ADD, R1, R2, reg=True))
    if gives_dumps(b):
        _copy_dumps(b, r, k + 4)
    b.emit(ldx(DW, R0, FP, STACK.ring_len), lshi(R0, 32), stx(DW, R1, k + 4, R0))     # end of options, trailer


def _copy_dumps(b, r, at: int) -> None:
    """The dumps' options (STACK.dump_val) at R1 + at, as long as they are: one bpf_probe_read_kernel. Out: R1 past
    them."""
    g = DUMP_OPTIONS
    b.emit(stx(DW, FP, STACK.given_at, R1), addi(R1, at), ldx(DW, R2, FP, g.len), asm.jmp(JGT, R2, _most(g), r.unlock),
           ldx(DW, R3, FP, g.val), addi(R3, g.value.off("text")), call(Helper.probe_read_kernel),
           asm.jmp(JNE, R0, 0, r.unlock), ldx(DW, R1, FP, STACK.given_at), ldx(DW, R2, FP, g.len),
           asm.jmp(JGT, R2, _most(g), r.unlock), alu64(ADD, R1, R2, reg=True))


def _comment_len(b, r, dst: int, tmp: int, given: int | None = None) -> None:
    """dst = the comment's length: the metadata's text, --context's names, the texts given (`given`: the first so
    many of them), each bounded."""
    b.emit(ldx(DW, dst, FP, STACK.text_len), asm.jmp(JGT, dst, TEXT_MAX, r.unlock))
    if names_context(b):
        b.emit(ldx(DW, tmp, FP, STACK.ctx_len), asm.jmp(JGT, tmp, CTX_MAX, r.unlock), alu64(ADD, dst, tmp, reg=True))
    for g in givens(b)[:given]:
        b.emit(ldx(DW, tmp, FP, g.len), asm.jmp(JGT, tmp, _most(g), r.unlock), alu64(ADD, dst, tmp, reg=True))


def _copy_given(b, r, at: int, i: int, g: Given) -> None:
    """The i-th text given (g.val) after the comment's text so far (R1 + at), as long as it is: one
    bpf_probe_read_kernel. Keeps R1 and R2."""
    _comment_len(b, r, R3, R0, given=i)
    b.emit(stx(DW, FP, STACK.given_at, R1), alu64(ADD, R1, R3, reg=True), addi(R1, at),
           ldx(DW, R2, FP, g.len), asm.jmp(JGT, R2, _most(g), r.unlock),
           ldx(DW, R3, FP, g.val), addi(R3, g.value.off("text")), call(Helper.probe_read_kernel),
           asm.jmp(JNE, R0, 0, r.unlock), ldx(DW, R1, FP, STACK.given_at))
    _comment_len(b, r, R2, R0)


def _opt(code: int, length: int) -> int:
    """An option's code and length as the 32-bit word they make (little-endian)."""
    return length << 16 | code


def _pair(first: str, second: str, src: int) -> asm.Insn:
    """META's adjacent 4-byte fields `first` and `second` of the record header at R1 + RING_CTRL in one store of
    src (second << 32 | first)."""
    assert META.width(first) == META.width(second) == 4 and META.end(first) == META.off(second)
    return stx(DW, R1, EPB_AT + META.off(first), src)


def _take_id(b) -> None:
    """META's id: (the ring's next_id + 1) << ID_CPU_BITS | the CPU, taken while this program holds the ring
    (fcap.kernel.track.in_ring). Keeps R1."""
    b.emit(RING.load(R3, R9, "next_id"), addi(R3, 1), RING.store(R9, "next_id", R3), lshi(R3, ID_CPU_BITS),
           ldx(W, R0, FP, STACK.ring_key), andi(R0, (1 << ID_CPU_BITS) - 1), alu64(OR, R3, R0, reg=True),
           META.store(R7, "id", R3))


def _orig_len(b, r) -> None:
    """R5 = the original length from the linktype's start: hdr + max(len - skip, 0). Keeps R1."""
    b.emit(META.load(R5, R7, "len"), META.load(R3, R7, "skip"), alu64(SUB, R5, R3, reg=True),
           asm.jmp(JSGT, R5, 0, r.orig), movi(R5, 0), label(r.orig), alu64(ADD, R5, R8, reg=True))


def _reserve(b, r, spill: int) -> None:
    """Room for STACK.ring_len bytes (+ spill) in this CPU's ring, taken for this writer. Out: R9 = the ring's
    element, R1 = R9 + the record's offset (the record at R1 + RING_CTRL), STACK.ring_off = the offset."""
    m = b.maps
    ring = m.ring_size
    b.emit(call(Helper.get_smp_processor_id), stx(W, FP, STACK.ring_key, R0),
           ld_map_fd(R1, m.ring), mov(R2, FP), addi(R2, STACK.ring_key), call(Helper.map_lookup_elem),
           asm.jmp(JEQ, R0, 0, r.fail), mov(R9, R0),
           # one writer at a time on this CPU (another point's program may interrupt this one)
           RING.load(R0, R9, "busy"), asm.jmp(JNE, R0, 0, r.fail), RING.store_imm(R9, "busy", 1),
           # an index entry free: (count - taken) < entries
           RING.load(R1, R9, "head"), mov(R5, R1), rshi(R5, HEAD_BITS), RING.load(R3, R9, "taken"),
           alu64(SUB, R5, R3, reg=True), andi(R5, HEAD_COUNT), asm.jmp(JGE, R5, index_entries(ring), r.unlock),
           # room: (head - tail) + len + spill <= ring
           RING.load(R3, R9, "tail"), ld_imm64(R0, HEAD_POS),
           alu64(AND, R1, R0, reg=True), mov(R5, R1), alu64(SUB, R5, R3, reg=True),
           alu64(AND, R5, R0, reg=True), ldx(DW, R4, FP, STACK.ring_len), alu64(ADD, R5, R4, reg=True),
           asm.jmp(JGT, R5, ring - spill, r.unlock),
           andi(R1, ring - 1), stx(DW, FP, STACK.ring_off, R1), alu64(ADD, R1, R9, reg=True))


def _bytes(b, r, hdr: int) -> None:
    """The link header bytes made in scratch (if any), then the skb's from offset skip, after the `hdr`-byte record
    header: one bpf_probe_read_kernel from skb->head when they are all linear, else (frags) through an skb dynptr.
    Needs R1 = record start, R8 = hdr_total, R9 = the element."""
    m = b.maps
    b.emit(asm.jmp(JEQ, R8, 0, r.link_done), addi(R1, RING_CTRL + hdr), mov(R2, R8),
           mov(R3, R7), addi(R3, PKT), call(Helper.probe_read_kernel), asm.jmp(JNE, R0, 0, r.unlock),
           label(r.link_done),
           # R1 = where the skb's bytes go, R2 = n
           ldx(DW, R1, FP, STACK.ring_off), asm.jmp(JGT, R1, m.ring_size - 1, r.unlock),
           alu64(ADD, R1, R9, reg=True), addi(R1, RING_CTRL + hdr), asm.jmp(JGT, R8, HDR_MAX, r.unlock),
           alu64(ADD, R1, R8, reg=True), ldx(DW, R2, FP, STACK.n), asm.jmp(JGT, R2, COPY_MAX, r.unlock),
           # linear (headlen - skip >= n): bpf_probe_read_kernel(dst, n, head + data offset + skip)
           META.load(R0, R7, "len"), ldx(W, R3, R6, b.offsets.data_len), alu64(SUB, R0, R3, reg=True),
           META.load(R4, R7, "skip"), alu64(SUB, R0, R4, reg=True),
           asm.jmp(JSLT, R0, R2, r.frags if m.dynptr_kfunc else r.unlock, reg=True))
    if b.options.head_loads:
        _words(b, r)
    b.emit(ldx(DW, R3, FP, STACK.head), ldx(DW, R0, FP, STACK.dataoff), alu64(ADD, R3, R0, reg=True),
           alu64(ADD, R3, R4, reg=True), call(Helper.probe_read_kernel), asm.jmp(JNE, R0, 0, r.unlock))
    if not m.dynptr_kfunc:   # (linear only: the others went to the perf buffer, frags_by_perf)
        b.emit(label(r.copied))
        return
    b.emit(ja(r.copied), label(r.frags),
           # bpf_dynptr_from_skb(skb, 0, &d); bpf_dynptr_read(dst, n, &d, skip, 0)
           mov(R1, R6), movi(R2, 0), mov(R3, FP), addi(R3, STACK.dynptr),
           asm.kfunc_call(m.dynptr_kfunc), asm.jmp(JNE, R0, 0, r.unlock),
           ldx(DW, R1, FP, STACK.ring_off), asm.jmp(JGT, R1, m.ring_size - 1, r.unlock),
           alu64(ADD, R1, R9, reg=True), addi(R1, RING_CTRL + hdr), asm.jmp(JGT, R8, HDR_MAX, r.unlock),
           alu64(ADD, R1, R8, reg=True), ldx(DW, R2, FP, STACK.n), asm.jmp(JGT, R2, COPY_MAX, r.unlock),
           mov(R3, FP), addi(R3, STACK.dynptr), META.load(R4, R7, "skip"), movi(R5, 0),
           call(Helper.dynptr_read), asm.jmp(JNE, R0, 0, r.unlock), label(r.copied))


def _words(b, r) -> None:
    """Up to SMALL_COPY linear bytes copied by direct 8-byte loads through skb->head (no helper call), the last
    word's bytes past n cleared again. In: R1 = destination, R2 = n, R4 = skip. On to r_copied, or on when n is
    larger."""
    b.emit(asm.jmp(JGT, R2, SMALL_COPY, r.probe), b.skb_head(R3), ldx(DW, R0, FP, STACK.dataoff),
           alu64(ADD, R3, R0, reg=True), alu64(ADD, R3, R4, reg=True))
    for i in range(0, SMALL_COPY, 8):
        if i:
            b.emit(asm.jmp(JLE, R2, i, r.words))
        b.emit(ldx(DW, R0, R3, i), stx(DW, R1, i, R0))
    b.emit(label(r.words), mov(R0, R1), alu64(ADD, R0, R2, reg=True), st(DW, R0, 0, 0), ja(r.copied),
           label(r.probe))


def _advance_head() -> list:
    """head += R1, the record's bytes and count made visible to user space after them; R1 = the old head.
    Only the program holding the ring (busy) writes head and user space only reads it, so a store-release does it
    where the verifier takes one (6.15+): on x86 a plain store, where a locked add (the older kernels' way) waits
    for every store of the record to reach the cache first (~20 ns for a pcap record here, ~40 for a pcapng one)."""
    head = RING.off("head")
    if probes.store_release() is None:
        return [RING.load(R2, R9, "head"), alu64(ADD, R1, R2, reg=True), asm.store_release(DW, R9, head, R1),
                mov(R1, R2)]
    if probes.atomic_fetch() is None:
        return [asm.fetch_add(DW, R9, head, R1)]
    # (before 5.12, x86-64 only: can_publish) XADD, locked; the old head read first (only this program writes it)
    return [RING.load(R2, R9, "head"), asm.atomic_add(DW, R9, head, R1), mov(R1, R2)]


def _publish(b, r) -> None:
    """Copy a record's overflow past the ring's end to its start, publish it (position and count in one store of
    head), ring the doorbell when due, release the ring, and leave (to "out"); a failure sets R0 = -1 and falls
    through to the counting (seen and lost)."""
    m = b.maps
    ring = m.ring_size
    b.emit(ldx(DW, R3, FP, STACK.ring_off), ldx(DW, R2, FP, STACK.ring_len), alu64(ADD, R2, R3, reg=True),
           asm.jmp(JLE, R2, ring, r.publish), addi(R2, -ring), asm.jmp(JGT, R2, REC_MAX, r.unlock),
           mov(R1, R9), addi(R1, RING_CTRL), mov(R3, R9), addi(R3, RING_CTRL + ring),
           call(Helper.probe_read_kernel), asm.jmp(JNE, R0, 0, r.unlock),
           label(r.publish),
           # a record older than the one before (this program interrupted another point's before it took the
           # ring) is counted: user space then merges this CPU's records one by one
           META.load(R0, R7, "ts"), RING.load(R4, R9, "last"), RING.store(R9, "last", R0),
           asm.jmp(JGE, R0, R4, r.in_order, reg=True), RING.load(R4, R9, "disorder"), addi(R4, 1),
           RING.store(R9, "disorder", R4), label(r.in_order),
           # the index entry (head's count & (entries - 1)): the timestamp and where the record ends
           RING.load(R2, R9, "head"), mov(R3, R2), rshi(R3, HEAD_BITS), andi(R3, index_entries(ring) - 1),
           lshi(R3, 4), alu64(ADD, R3, R9, reg=True), addi(R3, index_at(ring)),
           META.load(R0, R7, "ts"), RING_INDEX.store(R3, "ts", R0),
           ld_imm64(R0, HEAD_POS), alu64(AND, R2, R0, reg=True), ldx(DW, R4, FP, STACK.ring_len),
           alu64(ADD, R2, R4, reg=True), alu64(AND, R2, R0, reg=True), RING_INDEX.store(R3, "end", R2),
           ldx(DW, R1, FP, STACK.ring_len), ld_imm64(R0, HEAD_ONE), alu64(ADD, R1, R0, reg=True),
           _advance_head(),
           # the doorbell: a quarter of the ring in use after this record, not rung since user space cleared it
           ldx(DW, R2, FP, STACK.ring_len), alu64(ADD, R1, R2, reg=True), RING.load(R3, R9, "tail"),
           alu64(SUB, R1, R3, reg=True), ld_imm64(R0, HEAD_POS), alu64(AND, R1, R0, reg=True),
           asm.jmp(JLT, R1, ring // 4, r.done), RING.load(R0, R9, "bell"), asm.jmp(JNE, R0, 0, r.done),
           RING.store_imm(R9, "bell", 1), st(DW, FP, STACK.bell, 0),
           ldx(DW, R1, FP, STACK.ctx), ld_map_fd(R2, m.events), ld_imm64(R3, F_CURRENT_CPU),
           mov(R4, FP), addi(R4, STACK.bell), movi(R5, 8), call(Helper.perf_event_output),
           # a published record is counted by the ring's own count (user space adds it to the program's count of
           # failures: received = published + dropped), so success skips the counters (unless count_seen: the
           # per-point counts of a multi-point pcapng file's ISBs)
           label(r.done), RING.store_imm(R9, "busy", 0),
           [movi(R0, 0), ja(r.count)] if b.options.count_seen else ja("out"))
    if frags_by_perf(m) or names_context(b) or givens(b) or gives_dumps(b):
        # (counted as the perf buffer's records are: seen, and lost where it had no room)
        b.emit(label(r.perf), asm.jmp(JLE, R2, SAMPLE_COPY_MAX, r.sample), movi(R2, SAMPLE_COPY_MAX),
               label(r.sample))
        b.perf_output(m.frags)
        b.emit(ja(r.count))
    b.emit(label(r.unlock), RING.store_imm(R9, "busy", 0),
           label(r.fail), movi(R0, -1), label(r.count))
