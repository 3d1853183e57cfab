"""Where a packet was dropped, at every kind of drop point: at a drop function (its reason an argument) the programs
read the function's return address, the location the kernel's own kfree_skb tracepoint names."""

from __future__ import annotations

import os
import socket

import pytest
from conftest import require_kind
from netns import run_fcap
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
