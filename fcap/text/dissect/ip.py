"""IPv4, IPv6 with its extension headers, and the demux to what they carry (TCP, UDP, ICMP, tunnels)."""

from __future__ import annotations

from fcap.text.dissect.icmp import icmp
from fcap.text.dissect.icmp6 import icmp6
from fcap.text.dissect.reader import PrintState, Truncated
from fcap.text.dissect.transport import tcp, udp

_HOPOPTS, _ROUTING, _FRAGMENT, _DSTOPTS = 0, 43, 44, 60
_PAD1, _JUMBO_OPT, _ROUTER_ALERT = 0, 0xC2, 5


# ------------------------------------------------------------------------------------------ IPv4

def ip4(p: PrintState, off: int, length: int) -> None:
    p.proto = "ip"
    version = p.u8(off) >> 4
    if version != 4:
        p.add(("IP6, wrong link-layer encapsulation" if version == 6 else f"IP{version}") + " (invalid)")
        return
    if not p.eflag:
        p.add("IP ")
    p.need(off, 20, soft=True)
    hlen, total, src, dst = (p.b[off] & 15) * 4, p.u16(off + 2), p.ip4(off + 12), p.ip4(off + 16)
    p.layer("ip", version=4, src=src, dst=dst, proto=p.b[off + 9], ttl=p.b[off + 8], len=total)
    if length < 20 or hlen < 20:
        p.add(f"truncated-ip {length}" if length < 20 else f"bad-hlen {hlen}")
        return
    if length < total:
        p.add(f"truncated-ip - {total - length} bytes missing! ")
    if total < hlen:
        p.add(f"bad-len {total}")
        return
    p.end = min(p.end, off + total)  # tcpdump's nd_push_snaplen: padding after the datagram is not its payload
    frag, proto = p.u16(off + 6), p.u8(off + 9)
    if frag & 0x1FFF:
        p.add(f"{src} > {dst}: ip-proto-{proto}")
        return
    if proto not in (6, 17):  # (tcpdump's SCTP and DCCP printers print addresses with ports; those are not here)
        p.add(f"{src} > {dst}: ")
    if p.end - off < hlen:
        p.add(f" [remaining caplen({p.end - off}) < header length({hlen})]")
        raise Truncated
    demux(p, off + hlen, total - hlen, 4, frag & 0x2000, proto, off)


def demux(p: PrintState, off: int, length: int, ver: int, fragmented: int, nh: int, ip_off: int) -> None:
    """What an IPv4 or IPv6 header at ip_off carries at off: protocol nh, length bytes."""
    if nh == 6:
        tcp(p, off, length, ip_off, ver)
    elif nh == 17:
        udp(p, off, length, ip_off, ver, fragmented)
    elif nh == 1 and ver == 4:
        icmp(p, off, length)
    elif nh == 58 and ver == 6:
        icmp6(p, off, length)
    elif nh in (1, 2, 58):
        p.add(f"[{ {1: 'ICMP', 2: 'IGMP', 58: 'ICMPv6'}[nh]} requires IPv{6 if nh == 58 else 4}] (invalid)"
              if (nh == 58) == (ver == 4) else f" ip-proto-{nh} {length}")
    elif nh in (4, 41):
        p.recording = False   # (a tunnel's inner packet: printed, not recorded)
        (ip4 if nh == 4 else ip6)(p, off, length)
    else:
        p.add("no next header" if nh == 59 else f" ip-proto-{nh} {length}")


# ------------------------------------------------------------------------------------------ IPv6

def ip6(p: PrintState, off: int, length: int) -> None:
    p.proto = "ip6"
    p.need(off, 40, soft=True)
    if length < 40:
        p.add(f"truncated-ip6 {length}")
        return
    if not p.eflag:
        p.add("IP6 ")
    if p.b[off] >> 4 != 6:
        p.add(f"version error: {p.b[off] >> 4} != 6")
        return
    ip = p.layer("ip", version=6, src=p.ip6(off + 8), dst=p.ip6(off + 24), ttl=p.b[off + 7],
                 len=p.u16(off + 4) + 40, proto=p.b[off + 6])
    _Ip6Walk(p, off, length, ip).run()


class _Ip6Walk:
    """An IPv6 header's chain of extension headers, walked as tcpdump's ip6_print walks it. Each header's
    method prints it and returns the size to skip to the next one, or 0 when printing stops. The protocol the
    chain ends in goes into ip (the recorded layer)."""

    __slots__ = ("p", "off", "length", "ip", "plen", "left", "total", "prev", "found_ext", "found_jumbo",
                 "found_hbh", "fragmented")

    def __init__(self, p: PrintState, off: int, length: int, ip: dict) -> None:
        self.p, self.off, self.length, self.ip = p, off, length, ip
        self.plen = plen = p.u16(off + 4)
        self.left = plen + 40 if plen else length + 40  # bytes of the datagram from the header being walked
        self.total, self.prev = 0, 255
        self.found_ext = self.found_jumbo = self.found_hbh = self.fragmented = False

    def run(self) -> None:
        p, off = self.p, self.off
        if self.plen and self.length < self.left:
            p.add(f"truncated-ip6 - {self.left - self.length} bytes missing!")
        nh = p.u8(off + 6)
        p.end = min(p.end, off + self.left)
        cp, advance = off, 40
        while cp < p.end and advance > 0:
            if self.left < advance:
                raise Truncated
            cp, self.left, self.total = cp + advance, self.left - advance, self.total + advance
            if cp == off + 40 and nh not in (6, 17):
                p.add(f"{p.ip6(off + 8)} > {p.ip6(off + 24)}: ")
            advance = self._HEADERS.get(nh, _Ip6Walk.upper_layer)(self, cp, nh)
            if advance:
                nh = self.prev = self.ip["proto"] = p.u8(cp)
                p.proto = "ip6"

    def hop_by_hop(self, cp: int, nh: int) -> int:
        p = self.p
        if self.found_hbh or self.prev != 255:
            p.add("[The Hop-by-Hop Options header " + (
                "was already found]" if self.found_hbh else "don't follow the IPv6 header]") + " (invalid)")
            return 0
        p.proto = "hbhopt"
        advance = (p.u8(cp + 1) + 1) << 3
        jumbo = False
        if cp + advance <= p.end:
            p.add("HBH ")
            jumbo = _jumbo(p, cp + 2, advance - 2, self.plen)
        if jumbo is False:
            p.add(" [|hbhopt]")
        elif jumbo is not None:
            self.found_jumbo, self.plen = True, jumbo
        if self.plen == 0 and not self.found_jumbo:
            p.add("[No valid Jumbo Payload Hop-by-Hop option found] (invalid)")
            return 0
        if jumbo is False:
            return 0
        self.found_ext = self.found_hbh = True
        return advance

    def destination_options(self, cp: int, nh: int) -> int:
        p = self.p
        p.proto = "dstopt"
        advance = (p.u8(cp + 1) + 1) << 3
        p.need(cp, advance)
        p.add("DSTOPT ")
        self.found_ext = True
        return advance

    def fragment(self, cp: int, nh: int) -> int:
        p, off = self.p, self.off
        p.proto = "frag6"
        offset = p.u16(cp + 2) & 0xFFF8
        self.ip["proto"] = p.u8(cp)
        p.add(f"frag ({offset}|{(40 + p.u16(off + 4) - (cp - off) - 8) % 2**64})")
        if offset:
            return 0
        p.add(" ")
        self.found_ext = self.fragmented = True
        return 0 if p.end <= cp + 8 else 8

    def routing(self, cp: int, nh: int) -> int:
        self.p.need(cp, 1, soft=True)
        self.p.proto = "rt6"
        self.found_ext = True
        return _rt6(self.p, cp)

    def upper_layer(self, cp: int, nh: int) -> int:
        p, off, left = self.p, self.off, self.left
        if self.found_jumbo:
            left = self.plen + 40
            if left < self.total:
                raise Truncated
            if self.length < left:
                p.add(f"truncated-ip6 - {left - self.length} bytes missing!")
            p.end, left = min(len(p.b), off + left), left - self.total
        elif self.plen == 0:
            if self.found_ext:
                raise Truncated
            p.end, left = min(len(p.b), off + 40), 40 - self.total
        demux(p, cp, left, 6, self.fragmented, nh, off)
        return 0

    _HEADERS = {_HOPOPTS: hop_by_hop, _DSTOPTS: destination_options, _FRAGMENT: fragment, _ROUTING: routing}


def _jumbo(p: PrintState, off: int, length: int, plen: int):
    """Hop-by-hop options: a valid jumbo payload length, None if there is none, False if the options are damaged
    (tcpdump also names the damage, "(jumbo: trunc)" and the like; that is not copied here)."""
    i, jumbo = 0, None
    while i < length:
        kind = p.b[off + i]
        size = 1 if kind == _PAD1 else p.b[off + i + 1] + 2 if i + 1 < length else length + 1
        if i + size > length or (kind == _ROUTER_ALERT and size != 4) or (kind == _JUMBO_OPT and size != 6):
            return False
        if kind == _JUMBO_OPT and jumbo is None and plen == 0 and p.u32(off + i + 2) >= 65536:
            jumbo = p.u32(off + i + 2)
        i += size
    return jumbo


def _rt6(p: PrintState, cp: int) -> int:
    """A routing header (types 0, 2 and 4 as tcpdump shows them); its length, or 0 to stop."""
    p.add("RT6")
    rlen = p.u8(cp + 1)
    p.add(f" (len={rlen}")
    rtype = p.u8(cp + 2)
    p.add(f", type={rtype}" + (" [Deprecated]" if rtype == 0 else ""))
    p.add(f", segleft={p.u8(cp + 3)}")
    if rtype in (0, 2) and p.u32(cp + 4):
        p.add(f", rsv=0x{p.u32(cp + 4):x}")
    elif rtype == 4:
        p.add(f", last-entry={p.u8(cp + 4)}" + (f", flags=0x{p.b[cp + 5]:x}" if p.u8(cp + 5) else "")
              + f", tag={p.u16(cp + 6):x}")
    if rtype not in (0, 2, 4) or rlen % 2:
        p.add(" (unknown type) (invalid)" if rtype not in (0, 2, 4) else f" (invalid length {rlen}) (invalid)")
        return 0
    p.add("".join(f", [{i}]{p.ip6(cp + 8 + 16 * i)}" for i in range(rlen // 2)) + ") ")
    return (rlen + 1) << 3
