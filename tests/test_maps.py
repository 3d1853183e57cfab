"""bpf.maps against the kernel: a per-CPU array read whole (BPF_MAP_LOOKUP_BATCH) gives what key-by-key lookups
give, every key and CPU in its place."""

from __future__ import annotations

import os

import pytest

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (creates BPF maps)")


@pytest.mark.parametrize("entries", [1, 5, 3000])
def test_percpu_array_read_whole_equals_each_key(entries):
    from bpf.maps import PerCPUArrayMap
    m = PerCPUArrayMap(24, entries, name="fcap_test_batch")
    try:
        for k in range(0, entries, max(entries // 97, 1)):   # (some keys written, distinct per key and CPU)
            m.update(k, b"".join((k * 1000 + c).to_bytes(8, "little") * 3 for c in range(m.ncpus)))
        whole = m.lookup_all_percpu()
        assert len(whole) == entries
        assert whole == [m.lookup_percpu(k) for k in range(entries)]
        step = max(entries // 97, 1)
        last = (entries - 1) // step * step
        assert whole[last] == [(last * 1000 + c).to_bytes(8, "little") * 3 for c in range(m.ncpus)]
    finally:
        m.close()
