"""ICMP messages, as tcpdump -nn prints them (the IP header an error quotes is read here too)."""

from __future__ import annotations

from fcap.text.dissect.cksum import in_cksum, shouldbe
from fcap.text.dissect.reader import PrintState, hex_lines

ICMP_ERRORS = frozenset((3, 4, 5, 11, 12))   # the types that quote a packet (tcpdump -v prints it)
_MULTIPART = (3, 11, 12)     # the types that may carry RFC 4884's extensions after 128 bytes of the quoted packet
_EXT_OBJECTS = {1: "MPLS Stack Entry", 2: "Interface Identification"}

_ICMP = {0: "echo reply", 4: "source quench", 8: "echo request", 9: "router advertisement", 10: "router solicitation",
         13: "time stamp request", 14: "time stamp reply", 15: "information request", 16: "information reply",
         17: "address mask request"}
_UNREACH = {0: "net %s unreachable", 1: "host %s unreachable", 5: "%s unreachable - source route failed",
            6: "net %s unreachable - unknown", 7: "host %s unreachable - unknown",
            8: "%s unreachable - source host isolated", 9: "net %s unreachable - admin prohibited",
            10: "host %s unreachable - admin prohibited", 11: "net %s unreachable - tos prohibited",
            12: "host %s unreachable - tos prohibited", 13: "host %s unreachable - admin prohibited filter",
            14: "host %s unreachable - host precedence violation", 15: "host %s unreachable - precedence cutoff"}
_REDIRECT = {0: "redirect %s to net %s", 1: "redirect %s to host %s", 2: "redirect-tos %s to net %s",
             3: "redirect-tos %s to host %s"}

# ------------------------------------------------------------------------------------------ ICMP

def icmp(p: PrintState, off: int, plen: int, fragmented: int = 0) -> None:
    p.proto = "icmp"
    kind, code = p.u8(off), p.u8(off + 1)
    p.layer("icmp", type=kind, code=code)
    inner = off + 8  # the IP header an error message quotes
    if kind in (0, 8):
        text = f"echo {'request' if kind == 8 else 'reply'}, id {p.u16(off + 4)}, seq {p.u16(off + 6)}"
    elif kind == 3 and code == 3:
        p.need(inner + 9, 1, soft=True)
        proto = p.u8(inner + 9)
        dport = p.u16(inner + (p.u8(inner) & 15) * 4 + 2)
        what = {6: "tcp port", 17: "udp port"}.get(proto, f"protocol {proto} port")
        text = f"{p.ip4(inner + 16)} {what} {dport} unreachable"
    elif kind == 3 and code in (2, 4):
        mtu = p.u16(off + 6)
        text = (f"{p.ip4(inner + 16)} protocol {p.u8(inner + 9)} unreachable" if code == 2 else
                f"{p.ip4(inner + 16)} unreachable - need to frag" + (f" (mtu {mtu})" if mtu else ""))
    elif kind == 3:
        text = _UNREACH.get(code, "%s unreachable - #" + str(code)) % p.ip4(inner + 16)
    elif kind == 5:
        text = _REDIRECT.get(code, f"redirect-#{code} %s to %s") % (p.ip4(inner + 16), p.ip4(off + 4))
    elif kind == 11:
        p.need(inner + 16, 4, soft=True)
        text = {0: "time exceeded in-transit", 1: "ip reassembly time exceeded"}.get(code, f"time exceeded-#{code}")
    elif kind == 12:
        text = f"parameter problem - code {code}" if code else f"parameter problem - octet {p.u8(off + 4)}"
    elif kind == 18:
        text = f"address mask is 0x{p.u32(off + 8):08x}"
    elif kind == 13:
        text = f"time stamp query id {p.u16(off + 4)} seq {p.u16(off + 6)}"
    else:  # (router advertisements and time stamp replies carry more than is shown here)
        text = _ICMP.get(kind, f"type-#{kind}")
    p.add(f"ICMP {text}, length {plen}")
    if p.verbose and not fragmented and off + plen <= p.end:
        computed = in_cksum(p.b[off:off + plen])
        if computed:
            field = p.u16(off + 2)
            p.add(f" (wrong icmp cksum {field:x} (->{shouldbe(field, computed):x})!)")


def icmp_extensions(p: PrintState, off: int, plen: int) -> None:
    """tcpdump -v's multi-part extensions of an ICMP error (RFC 4884: MPLS label stacks, RFC 5837's interface
    objects in hex), past the 128 bytes of the quoted packet; none when a zero length field and a wrong checksum
    say there is no extension."""
    if p.b[off] not in _MULTIPART or plen <= 136:
        return
    ext = off + 136
    p.need(off, 141, soft=True)
    if p.b[off + 5] == 0 and ext + plen - 136 <= p.end and in_cksum(p.b[ext:ext + plen - 136]):
        return
    p.add(f"\n\tICMP Multi-Part extension v{p.b[ext] >> 4}")
    if p.b[ext] >> 4 != 2:
        p.add(" packet not supported")
        return
    hlen = plen - 136
    if ext + hlen <= p.end:
        p.add(f", checksum 0x{p.u16(ext + 2):04x} ({'in' if in_cksum(p.b[ext:ext + hlen]) else ''}correct),"
              f" length {hlen}")
    hlen, obj = hlen - 4, ext + 4
    while hlen > 4:
        p.need(obj, 4, soft=True)
        size, cls, ctype = p.u16(obj), p.b[obj + 2], p.b[obj + 3]
        p.add(f"\n\t  {_EXT_OBJECTS.get(cls, 'unknown')} Object ({cls}), Class-Type: {ctype}, length {size}")
        obj, hlen = obj + 4, hlen - 4
        if cls == 0 or size < 4:
            return
        size -= 4
        if cls == 1 and ctype == 1:
            label = p.u32(obj)
            p.add(f"\n\t    label {label >> 12}, tc {(label >> 9) & 7}" + (", [S]" if label & 0x100 else "")
                  + f", ttl {label & 0xFF}")
        elif size and obj < p.end:
            p.add("".join("\n\t    " + line[1:] for line in hex_lines(p.b[obj:min(obj + size, p.end)]).split("\n")))
        if hlen < size:
            break
        hlen, obj = hlen - size, obj + size
