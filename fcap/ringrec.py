"""The file ring: per-CPU byte streams of finished capture file records, written by the capture program itself
(pcap records; pcapng Enhanced Packet Blocks with their options, the metadata comment formatted in the kernel),
so that user space only writes the bytes out."""

from __future__ import annotations

from bpf import asm
from bpf.asm import (ADD, AND, DIV, DW, FP, JEQ, JGT, JLE, JLT, JNE, JSGT, MUL, R0, R1, R2, R3, R4, R5, R6, R7, R8,
                     R9, SUB, B, H, W, addi, alu64, andi, call, ja, label, ld_imm64, ld_map_fd, ldx, mov, movi,
                     rshi, st, stx)
from bpf.uapi import F_CURRENT_CPU, Helper

from . import program as cp

# ---- the ring ------------------------------------------------------------------------------------------------
# An mmapable array map, one element per possible CPU: RING_CTRL bytes of control words, then RING bytes of ring,
# then RING_SLACK bytes past its end. The program appends whole records at HEAD and publishes them with one
# atomic add: the low HEAD_BITS bits of HEAD are the byte position, the high bits count records. User space
# writes [TAIL, HEAD) as it is and stores HEAD's position in TAIL. A record that runs past the ring's end is
# written on into the slack and its overflow copied to the ring's start, so the stream is contiguous modulo RING.
# When a record leaves a quarter of the ring or more in use and BELL is 0, the program sets BELL and rings user
# space through the perf buffer (8 bytes); user space clears it before it reads HEAD.
RING_HEAD, RING_BUSY, RING_BELL, RING_TAIL = 0, 8, 16, 64
RING_CTRL = 128
HEAD_BITS = 40
HEAD_POS = (1 << HEAD_BITS) - 1
HEAD_ONE = 1 << HEAD_BITS
RING_MAX = 64 << 20      # per CPU (kernels before 6.x cap a map value at 4 MiB: then 2 MiB, see Session)

PCAP_HDR = 16            # ts_sec ts_nsec caplen len
EPB_HDR = 28             # type total interface ts_high ts_low caplen len
CAPLEN_MAX = cp.HDR_MAX + cp.COPY_MAX
TEXT_MAX = 168           # the comment: "skb=0x" + 16 + the middle (<= 127) + " len=" + 10 = 164 bytes at most
SPILL = TEXT_MAX + 8     # the comment is copied with fixed-size stores: this far past its start gets written
OPTS_MAX = 8 + 12 + 4 + TEXT_MAX + 4 + 4
REC_MAX = EPB_HDR + CAPLEN_MAX + 3 + OPTS_MAX
RING_SLACK = (REC_MAX + SPILL + 4095) & ~4095

# stack slots (below the builder's and the predicates')
STACK_RING_KEY = -200    # u32: this CPU's ring
STACK_RING_OFF = -208    # where this record starts in the ring
STACK_RING_LEN = -216    # the record's length
STACK_BELL = -224        # the 8-byte doorbell sample
STACK_TEXT_LEN = -232    # the comment's length

# ---- the comment's area in scratch (per CPU): a cache of the formatted middle and the text ------------------
# The middle (" pid=.. pkt_type=N") depends on pid/tid, comm, ifindex, mark, netns, protocol and pkt_type only;
# it is formatted again when one of them differs from the previous packet's on this CPU.
C_KEY, C_VALID, C_MIDLEN, C_TEXT = 0, 39, 40, 48
TEXT_SKB, TEXT_MID = 6, 22      # "skb=0x" then 16 hex digits (kernel addresses have all 16), then the middle
POS_MASK = 255
COMMENT_AREA = C_TEXT + POS_MASK + 1 + 16
MID_MAX = 127
_KEY = [(16, DW), (24, DW), (32, DW), (48, DW), (56, W), (60, H), (66, B)]   # META ranges -> C_KEY + (off - 16)
DIV10 = 0xCCCCCCCD       # (v * DIV10) >> 35 == v // 10 for every u32 v


def ring_room(record: str) -> int:
    """Bytes past a record's start that writing it may touch (its length + the comment's spill)."""
    return (EPB_HDR + 3 + OPTS_MAX + SPILL) if record == cp.RECORD_PCAPNG else PCAP_HDR


def emit(b) -> None:
    """The record into this CPU's file ring. In: R2 = copy, R8 = hdr_total (<= HDR_MAX), R7 scratch, R6 skb.
    Out: R0 = 0, or -1 when the record was dropped (no room, a nested writer, a failed read)."""
    # n = bytes from the skb (from offset skip), caplen = hdr + n
    b.emit(ldx(H, R3, R7, cp.OFF_SKIP), mov(R4, R2), alu64(SUB, R4, R3, reg=True),
           asm.jmp(JSGT, R4, 0, "r_pos"), movi(R4, 0), label("r_pos"),
           asm.jmp(JGT, R4, cp.COPY_MAX, "r_fail"), stx(DW, FP, cp.STACK_N, R4),
           alu64(ADD, R4, R8, reg=True), stx(W, R7, cp.OFF_CAPLEN, R4))
    if b.o.record == cp.RECORD_PCAPNG:
        _pcapng(b)
    else:
        _pcap(b)


def _pcap(b) -> None:
    b.emit(ldx(W, R4, R7, cp.OFF_CAPLEN), addi(R4, PCAP_HDR), stx(DW, FP, STACK_RING_LEN, R4))
    _reserve(b, 0)
    # the record header in place (R1 + RING_CTRL): ts_sec, ts_nsec (wall clock), caplen, len
    b.emit(ldx(DW, R0, R7, cp.OFF_TS), ld_imm64(R3, b.o.clock_offset_ns), alu64(ADD, R0, R3, reg=True),
           mov(R3, R0), alu64(DIV, R3, cp.NS), stx(W, R1, RING_CTRL, R3), alu64(MUL, R3, cp.NS),
           alu64(SUB, R0, R3, reg=True), stx(W, R1, RING_CTRL + 4, R0),
           ldx(W, R0, R7, cp.OFF_CAPLEN), stx(W, R1, RING_CTRL + 8, R0))
    _orig_len(b)
    b.emit(stx(W, R1, RING_CTRL + 12, R5))
    _bytes(b, PCAP_HDR)
    _publish(b)


def _pcapng(b) -> None:
    text = b.m.scratch_size - COMMENT_AREA + C_TEXT
    flags = {"out": 2, "in": 1}.get(b.p.direction)
    opts = (8 if flags else 0) + 12 + 4
    _comment(b, text)
    # length: 28 + caplen padded to 4 + flags + packet id + comment header + text padded to 4 + end + trailer
    b.emit(ldx(W, R4, R7, cp.OFF_CAPLEN), addi(R4, EPB_HDR + 3 + opts), andi(R4, -4),
           ldx(DW, R5, FP, STACK_TEXT_LEN), addi(R5, 3 + 8), andi(R5, -4), alu64(ADD, R4, R5, reg=True),
           stx(DW, FP, STACK_RING_LEN, R4))
    _reserve(b, SPILL)
    c = RING_CTRL
    b.emit(st(W, R1, c, cp.BT_EPB), ldx(DW, R0, FP, STACK_RING_LEN), stx(W, R1, c + 4, R0),
           st(W, R1, c + 8, b.p.id),
           ldx(DW, R0, R7, cp.OFF_TS), ld_imm64(R3, b.o.clock_offset_ns), alu64(ADD, R0, R3, reg=True),
           stx(W, R1, c + 16, R0), rshi(R0, 32), stx(W, R1, c + 12, R0),
           ldx(W, R0, R7, cp.OFF_CAPLEN), stx(W, R1, c + 20, R0))
    _orig_len(b)
    b.emit(stx(W, R1, c + 24, R5))
    _bytes(b, EPB_HDR)
    # options, after the bytes padded to 4: R1 = record start + caplen padded (options at R1 + c + 28)
    b.emit(ldx(DW, R1, FP, STACK_RING_OFF), asm.jmp(JGT, R1, b.m.ring_size - 1, "r_unlock"),
           alu64(ADD, R1, R9, reg=True), ldx(W, R2, R7, cp.OFF_CAPLEN), asm.jmp(JGT, R2, CAPLEN_MAX, "r_unlock"),
           mov(R3, R1), alu64(ADD, R3, R2, reg=True), st(W, R3, c + EPB_HDR, 0),    # the padding's zeros
           addi(R2, 3), andi(R2, -4), alu64(ADD, R1, R2, reg=True))
    k = c + EPB_HDR
    if flags:
        b.emit(st(H, R1, k, 2), st(H, R1, k + 2, 4), st(W, R1, k + 4, flags))         # epb_flags
        k += 8
    b.emit(st(H, R1, k, 5), st(H, R1, k + 2, 8), ldx(DW, R0, R7, cp.OFF_SKB), stx(DW, R1, k + 4, R0))  # packetid
    k += 12
    b.emit(st(H, R1, k, 1), ldx(DW, R2, FP, STACK_TEXT_LEN), asm.jmp(JGT, R2, TEXT_MAX, "r_unlock"),
           stx(H, R1, k + 2, R2))                                                      # opt_comment
    for j in range(0, TEXT_MAX, 8):
        b.emit(ldx(DW, R0, R7, text + j), stx(DW, R1, k + 4 + j, R0))
    b.emit(mov(R3, R1), alu64(ADD, R3, R2, reg=True), st(W, R3, k + 4, 0),             # the text's padding
           addi(R2, 3), andi(R2, -4), alu64(ADD, R1, R2, reg=True),
           st(W, R1, k + 4, 0), ldx(DW, R0, FP, STACK_RING_LEN), stx(W, R1, k + 8, R0))  # end, trailer
    _publish(b)


def _orig_len(b) -> None:
    """R5 = the original length from the linktype's start: hdr + max(len - skip, 0). Keeps R1."""
    b.emit(ldx(W, R5, R7, cp.OFF_LEN), ldx(H, R3, R7, cp.OFF_SKIP), alu64(SUB, R5, R3, reg=True),
           asm.jmp(JSGT, R5, 0, "r_orig"), movi(R5, 0), label("r_orig"), alu64(ADD, R5, R8, reg=True))


def _reserve(b, spill: int) -> None:
    """Room for STACK_RING_LEN bytes (+ spill) in this CPU's ring, taken for this writer. Out: R9 = the ring's
    element, R1 = R9 + the record's offset (the record at R1 + RING_CTRL), STACK_RING_OFF = the offset."""
    m = b.m
    ring = m.ring_size
    b.emit(call(Helper.get_smp_processor_id), stx(W, FP, STACK_RING_KEY, R0),
           ld_map_fd(R1, m.ring), mov(R2, FP), addi(R2, STACK_RING_KEY), call(Helper.map_lookup_elem),
           asm.jmp(JEQ, R0, 0, "r_fail"), mov(R9, R0),
           # one writer at a time on this CPU (another point's program may interrupt this one)
           ldx(W, R0, R9, RING_BUSY), asm.jmp(JNE, R0, 0, "r_fail"), st(W, R9, RING_BUSY, 1),
           # room: (head - tail) + len + spill <= ring
           ldx(DW, R1, R9, RING_HEAD), ldx(DW, R3, R9, RING_TAIL), ld_imm64(R0, HEAD_POS),
           alu64(AND, R1, R0, reg=True), mov(R5, R1), alu64(SUB, R5, R3, reg=True),
           alu64(AND, R5, R0, reg=True), ldx(DW, R4, FP, STACK_RING_LEN), alu64(ADD, R5, R4, reg=True),
           asm.jmp(JGT, R5, ring - spill, "r_unlock"),
           andi(R1, ring - 1), stx(DW, FP, STACK_RING_OFF, R1), alu64(ADD, R1, R9, reg=True))


def _bytes(b, hdr: int) -> None:
    """The link header bytes made in scratch (if any), then the skb's from offset skip (frags too) through an skb
    dynptr, after the `hdr`-byte record header. Needs R1 = record start, R8 = hdr_total, R9 = the element."""
    m = b.m
    b.emit(asm.jmp(JEQ, R8, 0, "r_link_done"), addi(R1, RING_CTRL + hdr), mov(R2, R8),
           mov(R3, R7), addi(R3, cp.PKT), call(Helper.probe_read_kernel), asm.jmp(JNE, R0, 0, "r_unlock"),
           label("r_link_done"),
           # bpf_dynptr_from_skb(skb, 0, &d); bpf_dynptr_read(dst, n, &d, skip, 0)
           mov(R1, R6), movi(R2, 0), mov(R3, FP), addi(R3, cp.STACK_DYNPTR),
           asm.kfunc_call(m.dynptr_kfunc), asm.jmp(JNE, R0, 0, "r_unlock"),
           ldx(DW, R1, FP, STACK_RING_OFF), asm.jmp(JGT, R1, m.ring_size - 1, "r_unlock"),
           alu64(ADD, R1, R9, reg=True), addi(R1, RING_CTRL + hdr), asm.jmp(JGT, R8, cp.HDR_MAX, "r_unlock"),
           alu64(ADD, R1, R8, reg=True), ldx(DW, R2, FP, cp.STACK_N), asm.jmp(JGT, R2, cp.COPY_MAX, "r_unlock"),
           mov(R3, FP), addi(R3, cp.STACK_DYNPTR), ldx(H, R4, R7, cp.OFF_SKIP), movi(R5, 0),
           call(Helper.dynptr_read), asm.jmp(JNE, R0, 0, "r_unlock"))


def _publish(b) -> None:
    """Copy a record's overflow past the ring's end to its start, publish it (position and count in one atomic
    add), ring the doorbell when due, release the ring. Sets R0 and falls through to the counting."""
    m = b.m
    ring = m.ring_size
    b.emit(ldx(DW, R3, FP, STACK_RING_OFF), ldx(DW, R2, FP, STACK_RING_LEN), alu64(ADD, R2, R3, reg=True),
           asm.jmp(JLE, R2, ring, "r_publish"), addi(R2, -ring), asm.jmp(JGT, R2, REC_MAX, "r_unlock"),
           mov(R1, R9), addi(R1, RING_CTRL), mov(R3, R9), addi(R3, RING_CTRL + ring),
           call(Helper.probe_read_kernel), asm.jmp(JNE, R0, 0, "r_unlock"),
           label("r_publish"),
           ldx(DW, R1, FP, STACK_RING_LEN), ld_imm64(R0, HEAD_ONE), alu64(ADD, R1, R0, reg=True),
           asm.fetch_add(DW, R9, RING_HEAD, R1),
           # the doorbell: a quarter of the ring in use after this record, not rung since user space cleared it
           ldx(DW, R2, FP, STACK_RING_LEN), alu64(ADD, R1, R2, reg=True), ldx(DW, R3, R9, RING_TAIL),
           alu64(SUB, R1, R3, reg=True), ld_imm64(R0, HEAD_POS), alu64(AND, R1, R0, reg=True),
           asm.jmp(JLT, R1, ring // 4, "r_done"), ldx(W, R0, R9, RING_BELL), asm.jmp(JNE, R0, 0, "r_done"),
           st(W, R9, RING_BELL, 1), st(DW, FP, STACK_BELL, 0),
           ldx(DW, R1, FP, cp.STACK_CTX), ld_map_fd(R2, m.events), ld_imm64(R3, F_CURRENT_CPU),
           mov(R4, FP), addi(R4, STACK_BELL), movi(R5, 8), call(Helper.perf_event_output),
           label("r_done"), st(W, R9, RING_BUSY, 0), movi(R0, 0), ja("r_count"),
           label("r_unlock"), st(W, R9, RING_BUSY, 0),
           label("r_fail"), movi(R0, -1), label("r_count"))


# ---- the comment, formatted as fcap.cli's _comment() does --------------------------------------------------------

def _comment(b, text: int) -> None:
    """The EPB comment's text at scratch + text; its length in STACK_TEXT_LEN. R9 is the write position."""
    base = text - C_TEXT
    b.emit(ldx(B, R0, R7, base + C_VALID), asm.jmp(JEQ, R0, 0, "c_miss"))
    for off, size in _KEY:
        b.emit(ldx(size, R0, R7, off), ldx(size, R1, R7, base + C_KEY + off - 16),
               asm.jmp(JNE, R0, R1, "c_miss", reg=True))
    b.emit(ja("c_hit"), label("c_miss"))
    for off, size in _KEY:
        b.emit(ldx(size, R0, R7, off), stx(size, R7, base + C_KEY + off - 16, R0))
    b.emit(st(B, R7, base + C_VALID, 1), movi(R9, TEXT_MID))
    _text(b, text, " pid=")
    b.emit(ldx(DW, R3, R7, cp.OFF_PIDTGID), rshi(R3, 32))
    _decimal(b, text, "pid")
    _text(b, text, " tid=")
    b.emit(ldx(W, R3, R7, cp.OFF_PIDTGID))
    _decimal(b, text, "tid")
    _text(b, text, " comm=")
    _comm(b, text)
    _text(b, text, " ifindex=")
    b.emit(ldx(W, R3, R7, cp.OFF_IFINDEX))
    _decimal(b, text, "ifindex")
    _text(b, text, " mark=0x")
    b.emit(ldx(W, R3, R7, cp.OFF_MARK))
    _hex(b, text, "mark")
    _text(b, text, " netns=")
    b.emit(ldx(W, R3, R7, cp.OFF_NETNS))
    _decimal(b, text, "netns")
    _text(b, text, " proto=0x")
    b.emit(ldx(H, R3, R7, cp.OFF_PROTO), asm.be(R3, 16), mov(R1, R7), alu64(ADD, R1, R9, reg=True))
    for i in range(4):   # four hex digits, leading zeros kept
        b.emit(mov(R0, R3), rshi(R0, 4 * (3 - i)), andi(R0, 15))
        _hex_char(b)
        b.emit(stx(B, R1, text + i, R0))
    b.emit(addi(R9, 4))
    _text(b, text, " pkt_type=")
    b.emit(ldx(B, R3, R7, cp.OFF_PKTTYPE))
    _decimal(b, text, "pkt_type")
    b.emit(addi(R9, -TEXT_MID), stx(W, R7, base + C_MIDLEN, R9),
           _put(text, 0, b"skb=0x"), label("c_hit"))
    # every packet: the skb's address (16 hex digits) and " len=N" after the cached middle
    b.emit(ldx(W, R9, R7, base + C_MIDLEN), asm.jmp(JGT, R9, MID_MAX, "r_fail"), addi(R9, TEXT_MID),
           ldx(DW, R0, R7, cp.OFF_SKB), rshi(R0, 32))
    _hex8(b)
    b.emit(stx(DW, R7, text + TEXT_SKB, R0), ldx(W, R0, R7, cp.OFF_SKB))
    _hex8(b)
    b.emit(stx(DW, R7, text + TEXT_SKB + 8, R0))
    _text(b, text, " len=")
    b.emit(ldx(W, R3, R7, cp.OFF_LEN))
    _decimal(b, text, "len")
    b.emit(stx(DW, FP, STACK_TEXT_LEN, R9))


def _put(text: int, at: int, data: bytes, base: int = R7) -> list:
    """Stores of constant bytes at base + text + at (R7: scratch)."""
    out, i = [], 0
    while i < len(data):
        n = 4 if len(data) - i >= 4 else 2 if len(data) - i >= 2 else 1
        out.append(st(asm.BYTES_SIZE[n], base, text + at + i, int.from_bytes(data[i:i + n], "little")))
        i += n
    return out


def _text(b, text: int, s: str) -> None:
    b.emit(mov(R1, R7), alu64(ADD, R1, R9, reg=True), _put(text, 0, s.encode(), R1), addi(R9, len(s)))


def _advance(b, text: int) -> None:
    """R9 += R4 (digits to come), bounded; R1 = scratch + R9: the digits are written backwards from R1 + text."""
    b.emit(alu64(ADD, R9, R4, reg=True), andi(R9, POS_MASK), mov(R1, R7), alu64(ADD, R1, R9, reg=True))


def _decimal(b, text: int, tag: str) -> None:
    """The u32 in R3 in decimal at the write position. The digit count is worked out without branches (so the
    verifier sees one range of positions, not ten)."""
    b.emit(movi(R4, 1))
    for k in range(1, 10):   # + (R3 >= 10**k), as the sign of 10**k - 1 - R3
        b.emit(movi(R0, 10 ** k - 1), alu64(SUB, R0, R3, reg=True), rshi(R0, 63), alu64(ADD, R4, R0, reg=True))
    _advance(b, text)
    b.emit(ld_imm64(R5, DIV10))
    for i in range(10):
        b.emit(mov(R0, R3), alu64(MUL, R0, R5, reg=True), rshi(R0, 35), mov(R2, R0), alu64(MUL, R2, 10),
               mov(R4, R3), alu64(SUB, R4, R2, reg=True), addi(R4, ord("0")), stx(B, R1, text - 1 - i, R4),
               mov(R3, R0))
        if i < 9:
            b.emit(asm.jmp(JEQ, R3, 0, f"d_{tag}"))
    b.emit(label(f"d_{tag}"))


def _hex(b, text: int, tag: str) -> None:
    """The u32 in R3 in hex (lower case, no leading zeros) at the write position."""
    b.emit(movi(R4, 1))
    for k in range(1, 8):
        b.emit(movi(R0, (1 << (4 * k)) - 1), alu64(SUB, R0, R3, reg=True), rshi(R0, 63), alu64(ADD, R4, R0, reg=True))
    _advance(b, text)
    for i in range(8):
        b.emit(mov(R0, R3), andi(R0, 15))
        _hex_char(b)
        b.emit(stx(B, R1, text - 1 - i, R0), rshi(R3, 4))
        if i < 7:
            b.emit(asm.jmp(JEQ, R3, 0, f"h_{tag}"))
    b.emit(label(f"h_{tag}"))


def _hex8(b) -> None:
    """The u32 in R0 -> its 8 hex digits (leading zeros kept) as 8 bytes in R0, first digit lowest: the nibbles
    spread one per byte, then turned into digits all at once. Uses R2, R4."""
    for shift, hi, lo in ((16, 0x0000FFFF00000000, 0xFFFF), (8, 0x00FF000000FF0000, 0x000000FF000000FF),
                          (4, 0x0F000F000F000F00, 0x000F000F000F000F)):
        b.emit(mov(R2, R0), asm.lshi(R2, shift), ld_imm64(R4, hi), alu64(AND, R2, R4, reg=True),
               ld_imm64(R4, lo), alu64(AND, R0, R4, reg=True), alu64(asm.OR, R0, R2, reg=True))
    b.emit(asm.be(R0, 64),   # byte k held nibble k (the lowest first): the highest digit goes first
           mov(R2, R0), ld_imm64(R4, 0x0606060606060606), alu64(ADD, R2, R4, reg=True), rshi(R2, 4),
           ld_imm64(R4, 0x0101010101010101), alu64(AND, R2, R4, reg=True), alu64(MUL, R2, 39),
           alu64(ADD, R0, R2, reg=True), ld_imm64(R4, 0x3030303030303030), alu64(ADD, R0, R4, reg=True))


def _hex_char(b) -> None:
    """R0 (0..15) -> its lower-case hex digit, without branches. Uses R2."""
    b.emit(mov(R2, R0), addi(R2, 6), rshi(R2, 4), alu64(MUL, R2, 39), alu64(ADD, R0, R2, reg=True),
           addi(R0, ord("0")))


def _comm(b, text: int) -> None:
    """comm up to its NUL: 16 bytes copied, the position moved by its length."""
    b.emit(mov(R1, R7), alu64(ADD, R1, R9, reg=True))
    for j in (0, 8):
        b.emit(ldx(DW, R0, R7, cp.OFF_COMM + j), stx(DW, R1, text + j, R0))
    for k in range(16):
        b.emit(movi(R4, k), ldx(B, R0, R7, cp.OFF_COMM + k), asm.jmp(JEQ, R0, 0, "c_comm_len"))
    b.emit(movi(R4, 16), label("c_comm_len"), alu64(ADD, R9, R4, reg=True), andi(R9, POS_MASK))
