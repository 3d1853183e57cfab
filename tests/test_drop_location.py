"""Where a packet was dropped, at every kind of drop point: at a drop function (its reason an argument) the programs
read the function's return address, the location the kernel's own kfree_skb tracepoint names."""

from __future__ import annotations

import os
import socket

import pytest
from conftest import require_kind
from netns import free_port, pcapng_plan, run_fcap, send_while_given, start_fcap
from test_capture import _sender


@pytest.mark.parametrize("kind", ["kprobe", "fentry"])
def test_a_drop_function_names_where_the_tracepoint_does(tmp_path, kind):
    """At a drop function (its reason an argument: sk_skb_reason_drop, kfree_skb_reason) the program reads the
    function's return address (a kprobe from the registers, fentry from the stack), the location the kernel's own
    kfree_skb tracepoint gives (its __builtin_return_address(0)): datagrams to a closed port on lo, recorded at
    both, name the same place in UDP's receive, and the same reason."""
    from fcap.points.spec import PointError, resolve
    import fcap
    for func in ("sk_skb_reason_drop", "kfree_skb_reason"):
        try:
            resolve(f"{kind}/{func}")
            break
        except PointError:
            continue
    else:
        pytest.skip("no drop function with its reason an argument here (Linux 5.17+)")
    require_kind(kind, func)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:   # (a port just closed: nobody listens)
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    n, tag, path = 3, os.urandom(8), str(tmp_path / "drops.pcapng")
    r = run_fcap(["-i", f"{kind}/{func}", "-i", "tp_btf/kfree_skb", "-w", path, f"udp and dst port {port}",
                  "--", *_sender(port, tag, n)])
    assert r.returncode == 0, r.stderr.decode()
    pkts = [p for p in fcap.read(path) if tag in bytes(p.data)]
    at_func = [p for p in pkts if p.point == f"{kind}/{func}"]
    at_tp = [p for p in pkts if p.point == "tp_btf/kfree_skb"]
    assert len(at_func) == len(at_tp) == n, [(p.point, p.reason, p.location) for p in pkts]
    for a, b in zip(by_ts(at_func), by_ts(at_tp)):
        assert (a.reason, a.location) == (b.reason, b.location) and a.skb == b.skb, (a, b)
        assert a.reason == "NO_SOCKET" and "udp" in a.location and "+0x" in a.location, a.location


def by_ts(pkts: list) -> list:
    return sorted(pkts, key=lambda p: p.ts_ns)


def test_the_programs_write_a_drops_names_user_space_gave_them(root, tmp_path):
    """Into pcapng where the programs write the file rings: the first datagram dropped at a (reason, location)
    goes through the perf buffer, user space names it and gives the text to the programs (the map fcap_droptext,
    read with bpftool), which write it into the comments of the drops after it themselves: the programs' count of
    records through the perf buffer (fcap_counters' seen) stays at that first one, and every comment ends with the
    text given: the reason UDP's receive gives a datagram to a closed port (where the tracepoint has one: 5.17+), and
    where."""
    from fcap.kernel.drops import reason_arg
    from fcap.kernel.layout import DROP_TEXT, DROP_TEXT_KEY
    from fcap.points.spec import resolve
    import fcap
    if not pcapng_plan(["tp_btf/kfree_skb"]).drop_texts:
        pytest.skip("the records go through the perf buffer on this kernel (no file rings): the names are user "
                    "space's")
    named = reason_arg(resolve("tp_btf/kfree_skb")) is not None
    port, path = free_port(), tmp_path / "drops.pcapng"
    fc = start_fcap(["-i", "tp_btf/kfree_skb", "-c", "42", "-w", str(path), f"udp dst port {port}"])
    try:
        first, counted, texts = send_while_given(fc, port, "fcap_droptext", DROP_TEXT)
        assert fc.wait() == 0, fc.stderr
    finally:
        fc.kill()
    pkts = list(fcap.read(str(path)))
    ((key, text),) = texts.items()
    key = DROP_TEXT_KEY.unpack(key)
    reason = "NO_SOCKET" if named else None
    assert key.named == named and text == (f" reason={reason}" if named else "") + f" at={pkts[0].location}", \
        (key, text)
    assert "udp" in pkts[0].location, pkts[0].location
    assert len(pkts) == 42 and all(p.comment.endswith(text) and p.reason == reason for p in pkts)
    assert all(p.packet_id for p in pkts) and len({p.packet_id for p in pkts}) == 42, \
        "the perf buffer's records have ids of their own"
    assert first == counted == 1, f"{first}, then {counted} records went through the perf buffer (the first's: the " \
                                  "programs write the rest)"
