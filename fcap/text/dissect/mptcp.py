"""The MPTCP option (TCP option 30, RFC 8684) as tcpdump 4.99 -nn prints it: its length, subtype and fields."""

from __future__ import annotations

from fcap.text.dissect.reader import PrintState

# TCP flags the subtypes' valid lengths depend on
_SYN, _ACK = 0x02, 0x10

# Every subtype starts: kind, length, subtype (high nibble) and 4 bits of its own; then the offsets below.
_SUBTYPE_AT = 2
# MP_CAPABLE: version (low nibble of byte 2), flags, the sender's key, the receiver's key
_CAP_FLAGS, _CAP_SENDER_KEY, _CAP_RECEIVER_KEY, _CAP_CSUM = 3, 4, 12, 0x80
# MP_JOIN: backup bit (byte 2), address id; then by length: SYN token+nonce, SYN/ACK hmac+nonce, ACK 20-byte hmac
_JOIN_B, _JOIN_ADDR_ID, _JOIN_TOKEN, _JOIN_NONCE, _JOIN_SYNACK_NONCE, _JOIN_ACK_HMAC_LEN = 0x01, 3, 4, 8, 12, 20
# DSS: flags (byte 3), then what they say is there
_DSS_FLAGS, _DSS_F, _DSS_m, _DSS_M, _DSS_a, _DSS_A = 3, 0x10, 0x08, 0x04, 0x02, 0x01
# ADD_ADDR: version/echo (low nibble of byte 2), address id, address, [port], [hmac]
_ADD_ADDR_ID, _ADD_ADDR_ADDR = 3, 4
_ADD_ADDR_ECHO = {0x6: "v0-ip6", 0x4: "v0-ip4", 0x1: "v1-echo", 0x0: "v1"}
_ADD_ADDR_LENS4, _ADD_ADDR_LENS6 = (8, 10, 16, 18), (20, 22, 28, 30)  # by length: with a port, with an hmac
# REMOVE_ADDR: the address ids from byte 3; MP_PRIO: backup bit (byte 2), [address id]; MP_FAIL, MP_FASTCLOSE: a
# 64-bit data sequence number or key from byte 4
_PRIO_B, _PRIO_ADDR_ID, _U64_AT = 0x01, 3, 4


def _capable(p: PrintState, at: int, ln: int, flags: int) -> bool:
    if not ((ln in (12, 4) and flags & _SYN) or (ln in (20, 22) and flags & (_SYN | _ACK) == _ACK)):
        return False
    version = p.u8(at + _SUBTYPE_AT) & 0xF
    if version > 1:
        p.add(f" Unknown Version ({version})")
        return True
    p.add(f" v{version}" + (" csum" if p.u8(at + _CAP_FLAGS) & _CAP_CSUM else ""))
    if ln == 12 or ln >= 20:
        p.add(f" {{0x{_u64(p, at + _CAP_SENDER_KEY):x}"
              + (f",0x{_u64(p, at + _CAP_RECEIVER_KEY):x}" if ln >= 20 else "") + "}")
    return True


def _join(p: PrintState, at: int, ln: int, flags: int) -> bool:
    if not ((ln == 12 and flags & _SYN) or (ln == 16 and flags & (_SYN | _ACK) == _SYN | _ACK)
            or (ln == 24 and flags & _ACK)):
        return False
    if ln != 24:
        p.add((" backup" if p.u8(at + _SUBTYPE_AT) & _JOIN_B else "") + f" id {p.u8(at + _JOIN_ADDR_ID)}")
    if ln == 12:
        p.add(f" token 0x{p.u32(at + _JOIN_TOKEN):x} nonce 0x{p.u32(at + _JOIN_NONCE):x}")
    elif ln == 16:
        p.add(f" hmac 0x{_u64(p, at + _JOIN_TOKEN):x} nonce 0x{p.u32(at + _JOIN_SYNACK_NONCE):x}")
    else:
        p.need(at + _JOIN_TOKEN, _JOIN_ACK_HMAC_LEN)
        p.add(" hmac 0x" + p.b[at + _JOIN_TOKEN:at + _JOIN_TOKEN + _JOIN_ACK_HMAC_LEN].hex())
    return True


def _dss(p: PrintState, at: int, ln: int, flags: int) -> bool:
    if ln < 4 or flags & _SYN:
        return False
    dss = p.u8(at + _DSS_FLAGS)
    p.add(" fin" if dss & _DSS_F else "")
    cp, left = at + 4, ln - 4
    for present, wide, name in ((_DSS_A, _DSS_a, "ack"), (_DSS_M, _DSS_m, "seq")):
        if not dss & present:
            continue
        p.add(f" {name} ")
        size = 8 if dss & wide else 4
        if left < size:
            return False
        p.add(str(_u64(p, cp) if size == 8 else p.u32(cp)))
        cp, left = cp + size, left - size
        if name == "seq":
            if left < 4:
                return False
            p.add(f" subseq {p.u32(cp)}")
            if left < 6:
                return False
            p.add(f" len {p.u16(cp + 4)}")
            cp, left = cp + 6, left - 6
            if left >= 2:   # the checksum, when negotiated
                p.add(f" csum 0x{p.u16(cp):x}")
                left -= 2
    return left == 0


def _add_addr(p: PrintState, at: int, ln: int, flags: int) -> bool:
    if ln not in _ADD_ADDR_LENS4 and ln not in _ADD_ADDR_LENS6:
        return False
    p.add(" " + _ADD_ADDR_ECHO.get(p.u8(at + _SUBTYPE_AT) & 0xF, "[bad version/echo]"))
    p.add(f" id {p.u8(at + _ADD_ADDR_ID)}")
    lens, size = (_ADD_ADDR_LENS4, 4) if ln in _ADD_ADDR_LENS4 else (_ADD_ADDR_LENS6, 16)
    addr = at + _ADD_ADDR_ADDR
    p.add(" " + (p.ip4(addr) if size == 4 else p.ip6(addr)))
    port = ln in (lens[1], lens[3])
    if port:
        p.add(f":{p.u16(addr + size)}")
    if ln in (lens[2], lens[3]):
        p.add(f" hmac 0x{_u64(p, addr + size + (2 if port else 0)):x}")
    return True


def _remove_addr(p: PrintState, at: int, ln: int, flags: int) -> bool:
    if ln < 4:
        return False
    p.need(at + 3, ln - 3)
    p.add(" id" + "".join(f" {c}" for c in p.b[at + 3:at + ln]))
    return True


def _prio(p: PrintState, at: int, ln: int, flags: int) -> bool:
    if ln not in (3, 4):
        return False
    p.add(" backup" if p.u8(at + _SUBTYPE_AT) & _PRIO_B else " non-backup")
    if ln == 4:
        p.add(f" id {p.u8(at + _PRIO_ADDR_ID)}")
    return True


def _fail(p: PrintState, at: int, ln: int, flags: int) -> bool:
    if ln != 12:
        return False
    p.add(f" seq {_u64(p, at + _U64_AT)}")
    return True


def _fast_close(p: PrintState, at: int, ln: int, flags: int) -> bool:
    if ln != 12:
        return False
    p.add(f" key 0x{_u64(p, at + _U64_AT):x}")
    return True


# by subtype; tcpdump 4.99.3 names every later subtype (MP_TCPRST among them) "unknown" and prints no more
_SUBTYPES = (("capable", _capable), ("join", _join), ("dss", _dss), ("add-addr", _add_addr),
             ("rem-addr", _remove_addr), ("prio", _prio), ("fail", _fail), ("fast-close", _fast_close))


def mptcp_option(p: PrintState, at: int, ln: int, tcp_flags: int) -> bool:
    """The text after "mptcp" of the option at `at` (its kind byte), `ln` bytes long, all of them captured, in a
    segment with these TCP flags; False where tcpdump finds it bad (it then prints "[bad opt]" after the text)."""
    if ln < 3:
        return False
    subtype = p.u8(at + _SUBTYPE_AT) >> 4
    name, printer = _SUBTYPES[subtype] if subtype < len(_SUBTYPES) else ("unknown", None)
    p.add(f" {ln} {name}")
    return printer(p, at, ln, tcp_flags) if printer else True


def _u64(p: PrintState, off: int) -> int:
    p.need(off, 8)
    return int.from_bytes(p.b[off:off + 8], "big")
