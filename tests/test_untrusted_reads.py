"""Reads through memory the verifier treats as untrusted (README "Untrusted memory"): an skb at its free, read in
place through skb->head by the filter and copied into the record; and after its free, where fcap reads nothing.
Each is read safely (loads the JIT guards, probe reads) or not at all: a record holds the bytes that were sent.
(A packet whose payload lies in page frags only: test_filter_live's test_payload_in_frags_is_filtered.)"""

from __future__ import annotations

import os
import socket

import pytest
from conftest import need_root, require_kind
from netns import run_fcap
from test_capture import _sender, _sent

import fcap
from fcap.points.spec import FREES_SKB, PointError, expand, resolve


def _drop_function(kind: str) -> str:
    for func in ("sk_skb_reason_drop", "kfree_skb_reason"):
        try:
            resolve(f"{kind}/{func}")
            return func
        except PointError:
            continue
    pytest.skip("no drop function with its reason an argument here (Linux 5.17+)")


def _has(func: str) -> bool:
    try:
        resolve(f"fentry/{func}")
        return True
    except PointError:
        return False


@pytest.mark.parametrize("kind", ["tp_btf", "fentry"])
def test_at_the_free_the_filter_and_the_record_read_the_packet_whole(tmp_path, kind):
    """Datagrams to a closed port are freed (NO_SOCKET): at the free tracepoint, or at the entry of the function that
    frees them, a filter that reads their payload (in place through skb->head where the verifier allows it) keeps
    each one, and each record holds the datagram as sent."""
    need_root()
    point = "tp_btf/kfree_skb" if kind == "tp_btf" else f"fentry/{_drop_function('fentry')}"
    if kind == "fentry":
        require_kind("fentry", point.split("/")[1])
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:   # (a port just closed: nobody listens)
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    n, tag, path = 5, os.urandom(8), str(tmp_path / "freed.pcapng")
    expr = f"udp and dst port {port} and udp[8:4] = 0x{tag[:4].hex()} and udp[12:4] = 0x{tag[4:].hex()}"
    r = run_fcap(["-i", point, "-w", path, expr, "--", *_sender(port, tag, n)])
    assert r.returncode == 0, r.stderr.decode()
    got = sorted(bytes(p.data)[-48:] for p in fcap.read(path))
    assert got == sorted(_sent(tag, n)), got


def test_after_a_free_no_program_reads_the_skb():
    """fexit at a function that frees its skb (its memory may be another packet's by then) is refused in one line
    naming the entry and the free tracepoints, and a fexit glob leaves those functions out."""
    func = next((f for f in ("consume_skb", "sk_skb_reason_drop", "kfree_skb_reason", "kfree_skb") if _has(f)), None)
    if func is None:
        pytest.skip("no function that frees an skb has BTF here")
    r = run_fcap(["-i", f"fexit/{func}", "-w", os.devnull])
    lines = r.stderr.decode().strip().splitlines()
    assert r.returncode == 1 and len(lines) == 1, r.stderr
    assert f"{func} frees the skb" in lines[0] and f"fentry/{func}" in lines[0] and "tp_btf/kfree_skb" in lines[0]
    names = {p.name for p in expand("fexit/*skb*")}
    assert names and not names & FREES_SKB, sorted(names & FREES_SKB)
    assert {"kfree_skb_partial", "skb_release_data"} & {p.name for p in expand("fentry/*skb*")}
