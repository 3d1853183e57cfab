"""IPv4, IPv6 with its extension headers, and the demux to what they carry (TCP, UDP, ICMP, tunnels)."""

from __future__ import annotations

from fcap.text.dissect.cksum import in_cksum, shouldbe
from fcap.text.dissect.icmp import ICMP_ERRORS, icmp, icmp_extensions
from fcap.text.dissect.icmp6 import icmp6
from fcap.text.dissect.ipopts import ip4_options, ip6_options
from fcap.text.dissect.reader import PrintState, Truncated
from fcap.text.dissect.transport import tcp, udp

_HOPOPTS, _ROUTING, _FRAGMENT, _DSTOPTS = 0, 43, 44, 60
# tcpdump's ipproto_values: the names -v prints after "proto" and "next-header"
IPPROTO_NAMES = {0: "Options", 1: "ICMP", 2: "IGMP", 4: "IPIP", 6: "TCP", 8: "EGP", 9: "IGRP", 17: "UDP", 33: "DCCP",
                 41: "IPv6", 43: "Routing", 44: "Fragment", 46: "RSVP", 47: "GRE", 50: "ESP", 51: "AH",
                 55: "Mobile IP", 58: "ICMPv6", 62: "Mobile IP (old)", 88: "EIGRP", 89: "OSPF", 103: "PIM",
                 108: "Compressed IP", 112: "VRRP", 113: "PGM", 132: "SCTP", 135: "Mobility", 143: "Ethernet"}
_ECN = ("", ",ECT(1)", ",ECT(0)", ",CE")
_FRAG_FLAGS = ((0x2000, "+"), (0x4000, "DF"), (0x8000, "rsvd"))


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
    if p.verbose and not _ip4_verbose(p, off, hlen, frag, proto):
        p.add(f"{src} > {dst}: ")
        raise Truncated(soft=True)
    if frag & 0x1FFF:
        p.add(f"{src} > {dst}: ip-proto-{proto}")
        return
    if proto not in (6, 17):  # (tcpdump's SCTP and DCCP printers print addresses with ports; those are not here)
        p.add(f"{src} > {dst}: ")
    if p.end - off < hlen:
        p.add(f" [remaining caplen({p.end - off}) < header length({hlen})]")
        raise Truncated
    demux(p, off + hlen, total - hlen, 4, frag & 0x2000, proto, off)


def _ip4_verbose(p: PrintState, off: int, hlen: int, frag: int, proto: int) -> bool:
    """tcpdump -v's "(tos 0x0, ttl 64, id 1, offset 0, flags [DF], proto TCP (6), length 84)" and the line's
    break; False when the options were cut short (tcpdump then prints the addresses and stops)."""
    tos, ttl = p.b[off + 1], p.b[off + 8]
    flags = ", ".join(name for bit, name in _FRAG_FLAGS if frag & bit) or "none"
    p.add(f"(tos 0x{tos:x}{_ECN[tos & 3]}" + (f", ttl {ttl}" if ttl else "")
          + f", id {p.u16(off + 4)}, offset {(frag & 0x1FFF) * 8}, flags [{flags}],"
          f" proto {IPPROTO_NAMES.get(proto, 'unknown')} ({proto}), length {p.u16(off + 2)}")
    whole = True
    if hlen > 20:
        p.add(", options (")
        whole = ip4_options(p, off + 20, hlen - 20)
        p.add(")" if whole else " [truncated-option])")
    if p.checks and off + hlen <= p.end:
        computed = in_cksum(p.b[off:off + hlen])
        if computed:
            field = p.u16(off + 10)
            p.add(f", bad cksum {field:x} (->{shouldbe(field, computed):x})!")
    p.add(")\n    ")
    return whole


def demux(p: PrintState, off: int, length: int, ver: int, fragmented: int, nh: int, ip_off: int) -> None:
    """What an IPv4 or IPv6 header at ip_off carries at off: protocol nh, length bytes."""
    if nh == 6:
        tcp(p, off, length, ip_off, ver, fragmented)
    elif nh == 17:
        udp(p, off, length, ip_off, ver, fragmented)
    elif nh == 1 and ver == 4:
        icmp(p, off, length, fragmented)
        if p.verbose and p.b[off] in ICMP_ERRORS:
            _quoted(p, off + 8)
        if p.verbose:
            icmp_extensions(p, off, length)
    elif nh == 58 and ver == 6:
        icmp6(p, off, length, ip_off, fragmented)
    elif nh in (1, 2, 58):
        p.add(f"[{ {1: 'ICMP', 2: 'IGMP', 58: 'ICMPv6'}[nh]} requires IPv{6 if nh == 58 else 4}] (invalid)"
              if (nh == 58) == (ver == 4) else f" ip-proto-{nh} {length}")
    elif nh in (4, 41):
        p.recording = False   # (a tunnel's inner packet: printed, not recorded)
        (ip4 if nh == 4 else ip6)(p, off, length)
    else:
        p.add("no next header" if nh == 59 else f" ip-proto-{nh} {length}")


# ------------------------------------------------------------------------------------------ IPv6

def _quoted(p: PrintState, inner: int) -> None:
    """tcpdump -v prints the packet an ICMP error quotes, as IPv4, on a line of its own, its capture ending where
    its IP length says."""
    p.add("\n\t")
    end, total = p.end, p.u16(inner + 2)
    p.recording, p.end = False, min(inner + total, end)
    try:
        ip4(p, inner, total)
    except Truncated as e:   # (a printer that said so and returned: the ICMP printer goes on)
        if not e.soft:
            raise
        if not e.said:
            p.add(f" [|{p.proto}]" + (e.args[0] if e.args else ""))
    finally:
        p.end = end
    p.proto = "icmp"


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
        if p.verbose:
            flow = p.u32(off)
            p.add("(" + (f"class 0x{(flow >> 20) & 0xFF:02x}, " if flow & 0x0FF00000 else "")
                  + (f"flowlabel 0x{flow & 0xFFFFF:05x}, " if flow & 0xFFFFF else "")
                  + f"hlim {p.b[off + 7]}, next-header {IPPROTO_NAMES.get(nh, 'unknown')} ({nh})"
                  f" payload length: {self.plen}) ")
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
            jumbo = ip6_options(p, cp + 2, advance - 2, self.plen)
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
        p.need(cp, advance, soft=True)
        p.add("DSTOPT ")
        if p.verbose and ip6_options(p, cp + 2, advance - 2, None) is False:
            p.add(" [|dstopt]")
            return 0
        self.found_ext = True
        return advance

    def fragment(self, cp: int, nh: int) -> int:
        p, off = self.p, self.off
        p.proto = "frag6"
        offset = p.u16(cp + 2) & 0xFFF8
        self.ip["proto"] = p.u8(cp)
        ident = f"0x{p.u32(cp + 4):08x}:" if p.verbose else ""
        p.add(f"frag ({ident}{offset}|{(40 + p.u16(off + 4) - (cp - off) - 8) % 2**64})")
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


def _rt6(p: PrintState, cp: int) -> int:
    """A routing header (types 0, 2 and 4 as tcpdump shows them); its length, or 0 to stop."""
    p.add("RT6")
    rlen = p.u8(cp + 1)
    p.add(f" (len={rlen}")
    rtype = p.u8(cp + 2)
    p.add(f", type={rtype}" + (" [Deprecated]" if rtype == 0 else ""))
    p.add(f", segleft={p.u8(cp + 3)}")
    if rtype in (0, 2) and (p.u32(cp + 4) or p.verbose):
        p.add(f", rsv=0x{p.u32(cp + 4):x}")
    elif rtype == 4:
        p.add(f", last-entry={p.u8(cp + 4)}" + (f", flags=0x{p.b[cp + 5]:x}" if p.u8(cp + 5) or p.verbose else "")
              + f", tag={p.u16(cp + 6):x}")
    if rtype not in (0, 2, 4) or rlen % 2:
        p.add(" (unknown type) (invalid)" if rtype not in (0, 2, 4) else f" (invalid length {rlen}) (invalid)")
        return 0
    p.add("".join(f", [{i}]{p.ip6(cp + 8 + 16 * i)}" for i in range(rlen // 2)) + ") ")
    return (rlen + 1) << 3
