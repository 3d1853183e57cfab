"""The pcapng comment of each packet, formatted by the capture program itself (fcap.kernel.layout's COMMENT, the same
text user space makes with format_comment): the middle once per change of the META fields it shows, cached in the
scratch value's comment area; the skb's address and the length every packet."""

from __future__ import annotations

from bpf import asm
from bpf.asm import (ADD, AND, BYTES_SIZE, DW, FP, JEQ, JGT, JNE, MUL, R0, R1, R2, R3, R4, R5, R7, R9, SUB, B, W,
                     addi, alu64, andi, ja, label, ld_imm64, ldx, mov, movi, rshi, st, stx)

from fcap.errors import ProgramError
from fcap.kernel.layout import (CAREA, COMMENT, KEY_WORDS, META, MID_MAX, READ, STACK, TEXT_MID, TEXT_POS_MASK,
                                TEXT_SKB)

DIV10 = 0xCCCCCCCD       # (v * DIV10) >> 35 == v // 10 for every u32 v


def text_offset(scratch_size: int, lead: int = 0) -> int:
    """Where the text lies from META (R7) in a scratch value of this size (the comment area comes last) whose META
    has `lead` bytes before it (--dump's area, fcap.kernel.progopts.dump_area)."""
    return scratch_size - lead - CAREA.size + CAREA.off("text")


def emit(b, text: int, fail: str) -> None:
    """The comment's text at scratch + text; its length in STACK.text_len. R9 is the write position. Jumps to
    `fail` (the record's failure: fcap.kernel.ringrec) when the cached middle's length is out of bounds."""
    area = text - CAREA.off("text")
    c = b.fresh_names("c", "hit", "miss", "skb_miss", "skb_hex", "len_miss", "len_done")
    c.fail = fail
    _cache_check(b, c, area)
    b.emit(movi(R9, TEXT_MID))
    (head, _, _), middle, (tail_pre, tail_attr, tail_style) = COMMENT[0], COMMENT[1:-1], COMMENT[-1]
    for pre, attr, style in middle:
        _text(b, text, pre)
        _value(b, text, attr, style)
    b.emit(addi(R9, -TEXT_MID), CAREA.store(R7, "midlen", R9, area), _put(text, 0, head.encode()), label(c.hit))
    # every packet: the skb's address (16 hex digits) and the length after the cached middle
    b.emit(CAREA.load(R9, R7, "midlen", area), asm.jmp(JGT, R9, MID_MAX, c.fail), addi(R9, TEXT_MID))
    _skb_high(b, c, area)
    b.emit(stx(DW, R7, text + TEXT_SKB, R0), ldx(W, R0, R7, META.off("skb")))
    _hex8(b)
    b.emit(stx(DW, R7, text + TEXT_SKB + 8, R0))
    _length(b, c, text, area, tail_pre, tail_attr, tail_style)
    b.emit(stx(DW, FP, STACK.text_len, R9))


def _skb_high(b, c, area: int) -> None:
    """R0 = the 8 hex digits of the skb address's high half: the last packet's when the half is the same (it
    rarely changes), else made (and remembered). Keeps R9."""
    b.emit(META.load(R3, R7, "skb"), rshi(R3, 32), CAREA.load(R0, R7, "skb_hi", area),
           asm.jmp(JNE, R0, R3, c.skb_miss, reg=True), CAREA.load(R0, R7, "skb_hi_hex", area), ja(c.skb_hex),
           label(c.skb_miss), CAREA.store(R7, "skb_hi", R3, area), mov(R0, R3))
    _hex8(b)
    b.emit(CAREA.store(R7, "skb_hi_hex", R0, area), label(c.skb_hex))


def _length(b, c, text: int, area: int, pre: str, attr: str, style: str) -> None:
    """The comment's last part (" len=" and the digits) at the write position: the last packet's 16 bytes of
    text when the length is the same (a flood repeats it), else made and remembered."""
    at = area + CAREA.off("len_text")
    b.emit(META.load(R3, R7, "len"), addi(R3, 1), CAREA.load(R0, R7, "len_key", area),
           asm.jmp(JNE, R0, R3, c.len_miss, reg=True),
           mov(R1, R7), alu64(ADD, R1, R9, reg=True), ldx(DW, R0, R7, at), stx(DW, R1, text, R0),
           ldx(DW, R0, R7, at + 8), stx(DW, R1, text + 8, R0),
           CAREA.load(R0, R7, "len_n", area), asm.jmp(JGT, R0, 16, c.fail), alu64(ADD, R9, R0, reg=True),
           andi(R9, TEXT_POS_MASK), ja(c.len_done),
           label(c.len_miss), CAREA.store(R7, "len_key", R3, area), stx(DW, FP, STACK.tmp, R9))
    _text(b, text, pre)
    _value(b, text, attr, style)
    b.emit(ldx(DW, R1, FP, STACK.tmp), andi(R1, TEXT_POS_MASK), mov(R0, R9), alu64(SUB, R0, R1, reg=True),
           CAREA.store(R7, "len_n", R0, area), alu64(ADD, R1, R7, reg=True),
           ldx(DW, R0, R1, text), stx(DW, R7, at, R0), ldx(DW, R0, R1, text + 8), stx(DW, R7, at + 8, R0),
           label(c.len_done))


def _cache_check(b, c, area: int) -> None:
    """Jump to c.hit when the META fields the middle shows are those it was made from; else note them."""
    key = CAREA.off("key") + area
    b.emit(CAREA.load(R0, R7, "valid", area), asm.jmp(JEQ, R0, 0, c.miss))
    at = key
    for off, n in KEY_WORDS:
        size = BYTES_SIZE[n]
        b.emit(ldx(size, R0, R7, off), ldx(size, R1, R7, at), asm.jmp(JNE, R0, R1, c.miss, reg=True))
        at += n
    b.emit(ja(c.hit), label(c.miss))
    at = key
    for off, n in KEY_WORDS:
        b.emit(ldx(BYTES_SIZE[n], R0, R7, off), stx(BYTES_SIZE[n], R7, at, R0))
        at += n
    b.emit(CAREA.store_imm(R7, "valid", 1, area))


def _value(b, text: int, attr: str, style: str) -> None:
    """A Record attribute, formatted in its style at the write position."""
    if style == "str":
        _comm(b, text)
        return
    field, how = READ[attr]   # (as fcap.kernel.record.READS reads it in user space)
    if how == "hi32":
        b.emit(META.load(R3, R7, field), rshi(R3, 32))
    elif how == "lo32":
        b.emit(ldx(W, R3, R7, META.off(field)))
    elif how == "be16":
        b.emit(META.load(R3, R7, field), asm.be(R3, 16))
    elif how == "":
        b.emit(META.load(R3, R7, field))
    else:
        raise ProgramError(f"the comment cannot show {attr} (read as {how!r}) in the kernel")
    {"dec": _decimal, "hex": _hex, "hex4": _hex4}[style](b, text, attr)


def _put(text: int, at: int, data: bytes, base: int = R7) -> list:
    """Stores of constant bytes at base + text + at (R7: scratch)."""
    out, i = [], 0
    while i < len(data):
        n = 4 if len(data) - i >= 4 else 2 if len(data) - i >= 2 else 1
        out.append(st(BYTES_SIZE[n], base, text + at + i, int.from_bytes(data[i:i + n], "little")))
        i += n
    return out


def _text(b, text: int, s: str) -> None:
    b.emit(mov(R1, R7), alu64(ADD, R1, R9, reg=True), _put(text, 0, s.encode(), R1), addi(R9, len(s)))


def _advance(b, text: int) -> None:
    """R9 += R4 (digits to come), bounded; R1 = scratch + R9: the digits are written backwards from R1 + text."""
    b.emit(alu64(ADD, R9, R4, reg=True), andi(R9, TEXT_POS_MASK), mov(R1, R7), alu64(ADD, R1, R9, reg=True))


def _decimal(b, text: int, tag: str) -> None:
    """The u32 in R3 in decimal at the write position. The digit count is worked out without branches (so the
    verifier sees one range of positions, not ten)."""
    done = b.fresh(f"d_{tag}")
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
            b.emit(asm.jmp(JEQ, R3, 0, done))
    b.emit(label(done))


def _hex(b, text: int, tag: str) -> None:
    """The u32 in R3 in hex (lower case, no leading zeros) at the write position."""
    done = b.fresh(f"h_{tag}")
    b.emit(movi(R4, 1))
    for k in range(1, 8):
        b.emit(movi(R0, (1 << (4 * k)) - 1), alu64(SUB, R0, R3, reg=True), rshi(R0, 63), alu64(ADD, R4, R0, reg=True))
    _advance(b, text)
    for i in range(8):
        b.emit(mov(R0, R3), andi(R0, 15))
        _hex_char(b)
        b.emit(stx(B, R1, text - 1 - i, R0), rshi(R3, 4))
        if i < 7:
            b.emit(asm.jmp(JEQ, R3, 0, done))
    b.emit(label(done))


def _hex4(b, text: int, tag: str) -> None:
    """The u16 in R3 as four hex digits, leading zeros kept."""
    b.emit(mov(R1, R7), alu64(ADD, R1, R9, reg=True))
    for i in range(4):
        b.emit(mov(R0, R3), rshi(R0, 4 * (3 - i)), andi(R0, 15))
        _hex_char(b)
        b.emit(stx(B, R1, text + i, R0))
    b.emit(addi(R9, 4))


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
    comm = META.off("comm")
    end = b.fresh("c_comm_len")
    b.emit(mov(R1, R7), alu64(ADD, R1, R9, reg=True))
    for j in (0, 8):
        b.emit(ldx(DW, R0, R7, comm + j), stx(DW, R1, text + j, R0))
    for k in range(16):
        b.emit(movi(R4, k), ldx(B, R0, R7, comm + k), asm.jmp(JEQ, R0, 0, end))
    b.emit(movi(R4, 16), label(end), alu64(ADD, R9, R4, reg=True), andi(R9, TEXT_POS_MASK))
