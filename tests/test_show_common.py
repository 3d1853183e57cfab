"""fcap.text.dissect.common's one-pass lines against the printers': every Ethernet packet of tcpdump's test captures
and of bench.printing's mixed file, whole, cut short, and with bytes changed, gives the printers' line or None."""

from __future__ import annotations

import random

import pytest

from fcap.files import linktypes
from fcap.text.dissect import dissect
from fcap.text.dissect.common import ether_line
from tests.corpus import ethernet_frames

EN10MB = linktypes.EN10MB.number


def _frames() -> list[bytes]:
    return ethernet_frames()


def _variants(frame: bytes, rng: random.Random):
    yield frame, len(frame)
    for cut in (14, 34, 42, 54, 60, 66, 74):
        if cut < len(frame):
            yield frame[:cut], len(frame)    # (cut short: the printers' business)
            yield frame[:cut], cut
    for _ in range(6):
        b = bytearray(frame)
        at = rng.randrange(len(b)) if b else 0
        if b:
            b[at] = rng.randrange(256)
        yield bytes(b), len(b)


@pytest.mark.parametrize("relative", [True, False])
def test_common_lines_are_the_printers(relative):
    rng = random.Random(43)
    fast_seqs, slow_seqs = ({}, {}) if relative else (None, None)
    checked = 0
    for frame in _frames():
        for data, orig_len in _variants(frame, rng):
            slow = dissect(data, EN10MB, orig_len, slow_seqs)
            fast = ether_line(data, orig_len, fast_seqs)
            if fast is None:   # the printers went on where ether_line gave up: keep the tables alike
                if fast_seqs is not None:
                    fast_seqs.clear()
                    fast_seqs.update(slow_seqs)
                continue
            assert (fast, 14) == (slow.text, slow.hdr), data.hex()
            assert slow.more == "" and fast_seqs == slow_seqs
            checked += 1
    assert checked > 500
