"""Semantic points (dev:queue, ip:send, skb:drop, ...): stable names over an unstable kernel, as DTrace's providers.
Each is a list of candidate hooks in order of preference; at start the first one this kernel serves is chosen (a
function must be in BTF and the kernel must load a program there; a tracepoint must exist)."""

from __future__ import annotations

import errno
from typing import NamedTuple

from bpf import probes
from bpf.btf import BTFError
from bpf.errors import BPFError

from fcap.points import pointcaps
from fcap.errors import PointError
from fcap.points.spec import Point, resolve

# name -> (what it means, candidates). A candidate is a tuple of hooks: the first must be served, the others are
# added where served (the IPv6 twin of an IPv4 function, say). Functions first where they see the same packets as
# the tracepoint (typed arguments; fentry is cheaper than a kprobe), the tracepoint first where it sees more or
# says more (kfree_skb names the drop reason and location; net_dev_start_xmit is where tcpdump's tap is, after GSO;
# netif_receive_skb sees the list receive path that __netif_receive_skb misses).
TABLE: dict[str, tuple[str, list[tuple[str, ...]]]] = {
    "dev:queue": ("handed to a device's transmit queue (before the qdisc)",
                  [("fentry/__dev_queue_xmit",), ("tp_btf/net_dev_queue",), ("kprobe/__dev_queue_xmit",)]),
    "dev:xmit": ("handed to the driver (tcpdump's transmit tap; after GSO)",
                 [("tp_btf/net_dev_start_xmit",), ("fentry/dev_hard_start_xmit",), ("kprobe/dev_hard_start_xmit",)]),
    "dev:receive": ("received by the stack from a device (tcpdump's receive tap)",
                    [("tp_btf/netif_receive_skb",), ("fentry/__netif_receive_skb",),
                     ("kprobe/__netif_receive_skb",)]),
    "ip:send": ("an IPv4 packet leaving the IP layer (local or forwarded)",
                [("fentry/ip_output",), ("kprobe/ip_output",)]),
    "ip:receive": ("an IPv4 packet entering the IP layer",
                   [("fentry/ip_rcv_core",), ("fentry/ip_rcv",), ("kprobe/ip_rcv_core",), ("kprobe/ip_rcv",)]),
    "ip6:send": ("an IPv6 packet leaving the IP layer", [("fentry/ip6_output",), ("kprobe/ip6_output",)]),
    "ip6:receive": ("an IPv6 packet entering the IP layer",
                    [("fentry/ip6_rcv_core",), ("fentry/ipv6_rcv",), ("kprobe/ip6_rcv_core",), ("kprobe/ipv6_rcv",)]),
    "tcp:send": ("a TCP segment sent (first transmission or again)",
                 [("fentry/__tcp_transmit_skb",), ("fentry/tcp_transmit_skb",), ("kprobe/__tcp_transmit_skb",)]),
    "tcp:receive": ("a TCP segment received by TCP (IPv4, IPv6)",
                    [("fentry/tcp_v4_rcv", "fentry/tcp_v6_rcv"), ("kprobe/tcp_v4_rcv", "kprobe/tcp_v6_rcv")]),
    "tcp:retransmit": ("a TCP segment sent again",
                       [("fentry/__tcp_retransmit_skb",), ("tp_btf/tcp_retransmit_skb",),
                        ("kprobe/__tcp_retransmit_skb",)]),
    "udp:send": ("a UDP datagram sent (IPv4, IPv6)",
                 [("fentry/udp_send_skb", "fentry/udp_v6_send_skb"),
                  ("kprobe/udp_send_skb", "kprobe/udp_v6_send_skb")]),
    "udp:receive": ("a UDP datagram received by UDP, socket or not (IPv4, IPv6)",
                    [("fentry/__udp4_lib_rcv", "fentry/__udp6_lib_rcv"), ("fentry/udp_rcv", "fentry/udpv6_rcv"),
                     ("kprobe/__udp4_lib_rcv", "kprobe/__udp6_lib_rcv")]),
    "skb:drop": ("a packet dropped (freed with a drop reason)",
                 [("tp_btf/kfree_skb",), ("fentry/kfree_skb_reason",), ("fentry/kfree_skb",),
                  ("kprobe/kfree_skb_reason",), ("kprobe/kfree_skb",)]),
    "skb:consume": ("a packet freed after normal use", [("tp_btf/consume_skb",), ("fentry/consume_skb",),
                                                      ("kprobe/consume_skb",)]),
}
LAYERS = {name.partition(":")[0] for name in TABLE}


def is_semantic(spec: str) -> bool:
    return spec.partition(":")[0] in LAYERS and "/" not in spec


class Choice(NamedTuple):
    """What a semantic point maps to on this kernel: its points (none: it cannot be served), and why each hook
    tried before them was not taken."""

    name: str
    meaning: str
    points: list[Point]
    refused: list[tuple[str, str]]   # (hook, why)

    @property
    def hooks(self) -> str:
        return " + ".join(p.spec for p in self.points)

    def why_not(self) -> str:
        """Why the hooks before the chosen ones were not taken, hooks with the same reason together."""
        by_why: dict[str, list[str]] = {}
        for hook, why in self.refused:
            by_why.setdefault(why, []).append(hook)
        return "; ".join(f"{', '.join(hooks)}: {why}" for why, hooks in by_why.items())


def choose(name: str) -> Choice:
    """The hooks this kernel serves `name` with (PointError for a name that is no semantic point)."""
    if name not in TABLE:
        from difflib import get_close_matches
        close = get_close_matches(name, TABLE, n=3, cutoff=0.5)
        hint = f"did you mean {' or '.join(close)}? " if close else ""
        raise PointError(f"{name}: no such semantic point ({hint}fcap list-devices --semantic lists them)")
    meaning, candidates = TABLE[name]
    choice = Choice(name, meaning, [], [])
    for hooks in candidates:
        first, why = _served(hooks[0])
        if first is None:
            choice.refused.append((hooks[0], why))
            continue
        choice.points.append(first)
        for extra in hooks[1:]:
            p, _why = _served(extra)
            if p is not None:
                choice.points.append(p)
        break
    for p in choice.points:
        p.alias = name
    return choice


def resolve_semantic(name: str) -> list[Point]:
    """The points for `name` on this kernel, or PointError saying why it cannot be served."""
    choice = choose(name)
    if not choice.points:
        raise PointError(f"{name}: this kernel serves none of its hooks: {choice.why_not()}")
    return choice.points


def _served(spec: str) -> tuple[Point | None, str]:
    """The hook as a Point when this kernel would load a program there, else (None, why not)."""
    try:
        p = resolve(spec)
    except PointError as e:
        return None, _after_spec(str(e), spec)
    refused = _probe(p)
    if refused:
        return None, refused
    return p, ""


def _after_spec(message: str, spec: str) -> str:
    return message[len(spec) + 2:] if message.startswith(spec + ": ") else message


def _probe(p: Point) -> str:
    """Why the kernel would not load a program at p ("" when it would)."""
    if p.kind.by_symbol:
        r = p.kind.probe()
        if r is None and not _in_kallsyms(p.name):
            return f"{p.name} is not in /proc/kallsyms (inlined or not probeable)"
        return r.reason if r is not None else ""
    try:
        with pointcaps.btf_obj_fd(p) as fd:
            policy = p.kind.probe(p.btf_id, fd)
            if policy is not None and policy.errno == errno.EPERM:   # the kind is refused here altogether
                return f"this kernel refuses {p.kind} programs (EPERM)"
            r = probes.tracing_program(p.kind.attach_type, p.btf_id, fd, label=p.spec)
        return f"the kernel will not load a program there ({r.reason})" if r is not None else ""
    except (BPFError, BTFError) as e:
        return str(e)


_kallsyms: set[str] | None = None


def _in_kallsyms(name: str) -> bool:
    global _kallsyms
    if _kallsyms is None:
        try:
            with open("/proc/kallsyms") as f:
                _kallsyms = {line.split()[2] for line in f if line.count(" ") >= 2}
        except OSError:
            return True   # (cannot tell: let the attach say)
    return name in _kallsyms


def table() -> list[Choice]:
    """Every semantic point and its mapping on this kernel (for list-devices --semantic)."""
    return [choose(name) for name in TABLE]
