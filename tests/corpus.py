"""Where the shared corpus is: tcpdump's test captures and libpcap's filter tables. $FCAP_CORPUS, else
../shared/corpus beside the checkout (tests/vm/run copies it into the guests from there), else /work/shared/corpus.
Tests that read it skip with the path they looked at when it is not there."""

from __future__ import annotations

import os
from pathlib import Path

_BESIDE = Path(__file__).resolve().parent.parent.parent / "shared" / "corpus"
CORPUS = Path(os.environ.get("FCAP_CORPUS") or (_BESIDE if _BESIDE.exists() else "/work/shared/corpus"))
FILTERS_TSV = CORPUS / "libpcap-filters.tsv"
CAPTURES = CORPUS / "tcpdump-tests"


def ethernet_frames() -> list[bytes]:
    """Every Ethernet frame of tcpdump's test captures (those that read whole), then bench.printing's mixed kinds."""
    from fcap.files import linktypes
    from fcap.files.pcapread import read
    frames = []
    for path in sorted(CAPTURES.glob("*.pcap*")) if CAPTURES.exists() else ():
        try:
            frames += [bytes(r.data) for r in read(path) if getattr(r, "linktype", None) == linktypes.EN10MB.number]
        except Exception:   # noqa: BLE001 - damaged captures are the printers' tests, not these
            continue
    from bench.printing import _packets
    return frames + _packets()
