"""bpf.btf_cache: the vmlinux BTF and its index kept per boot; a cached index gives the same types as a fresh scan,
and a stale or damaged cache file is rebuilt, never trusted."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from bpf import btf_cache
from bpf.btf import BTF

VMLINUX = "/sys/kernel/btf/vmlinux"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def cache_home(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    return tmp_path


def _vmlinux_blob() -> bytes:
    if not os.path.exists(VMLINUX):
        pytest.skip("this kernel has no BTF")
    with open(VMLINUX, "rb") as f:
        return f.read()


def test_round_trip_and_key(cache_home):
    blob = _vmlinux_blob()
    fresh = BTF.load(blob, name="vmlinux")
    ident = btf_cache.key(VMLINUX)
    assert btf_cache.load("vmlinux", ident) is None
    btf_cache.store("vmlinux", ident, blob, fresh._offs, fresh._kinds, fresh._record_names())
    cached = btf_cache.load("vmlinux", ident)
    assert cached is not None and cached[0] == blob
    assert list(cached[1]) == list(fresh._offs) and bytes(cached[2]) == bytes(fresh._kinds)
    assert list(cached[3]) == list(fresh._record_names())
    # another boot, another size or mtime: another key, and the file is not used
    assert btf_cache.load("vmlinux", ident.replace(b"vmlinux", b"vmlinuz")) is None
    assert os.path.dirname(btf_cache._file("vmlinux")) == str(cache_home / "fcap")


def test_cached_index_gives_the_same_types(cache_home):
    blob = _vmlinux_blob()
    fresh = BTF.load(blob, name="vmlinux")
    again = BTF.load(blob, name="vmlinux", index=(fresh._offs, fresh._kinds, fresh._record_names()))
    assert len(again) == len(fresh)
    for name, kind in (("sk_buff", "struct"), ("net_device", "struct"), ("btf_trace_net_dev_queue", "typedef"),
                       ("ip_output", "func"), ("net", None)):
        assert [t.id for t in again.find_all(name, kind)] == [t.id for t in fresh.find_all(name, kind)], name
    for i in range(1, len(fresh), 997):
        assert (again.type(i).kind, again.type(i).name) == (fresh.type(i).kind, fresh.type(i).name)
    # an index that does not fit the blob is ignored (the blob is scanned)
    bad = BTF.load(blob, name="vmlinux", index=(fresh._offs[:10], fresh._kinds[:10], fresh._record_names()[:10]))
    assert len(bad) == len(fresh)


@pytest.mark.parametrize("damage", ["truncate", "garbage", "empty"])
def test_damaged_cache_file_is_rebuilt(cache_home, damage):
    _vmlinux_blob()
    code = ("from bpf.btf import BTF; b = BTF.vmlinux(); "
            "print(b.find('sk_buff', 'struct').id, len(b))")
    env = dict(os.environ, XDG_CACHE_HOME=str(cache_home), PYTHONPATH=ROOT)
    first = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    path = cache_home / "fcap" / "vmlinux.btfcache"
    assert path.stat().st_size > 0
    assert "sk_buff\t" in (cache_home / "fcap" / "vmlinux-names.btfcache").read_bytes().decode(errors="replace")
    data = path.read_bytes()
    path.write_bytes({"truncate": data[:len(data) // 2], "garbage": data[:100] + b"\x55" * (len(data) - 100),
                      "empty": b""}[damage])
    second = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert second == first
    assert path.read_bytes() == data    # rebuilt


def test_list_devices_cached_per_boot(cache_home, root):
    """fcap list-devices: the cached list is the list (first run makes it, later runs read it; a damaged cache is
    made again)."""
    from netns import run_fcap, subprocess_env
    env = dict(subprocess_env(), XDG_CACHE_HOME=str(cache_home))
    runs = [run_fcap(["list-devices", "*xmit*"], env=env) for _ in range(2)]
    path = cache_home / "fcap" / "points.btfcache"
    assert path.exists()
    path.write_bytes(path.read_bytes()[:-7] + b"garbage")
    runs.append(run_fcap(["list-devices", "*xmit*"], env=env))
    outs = {r.stdout.decode() for r in runs}
    assert all(r.returncode == 0 for r in runs) and len(outs) == 1
    assert "tp_btf/net_dev_start_xmit  void net_dev_start_xmit(" in outs.pop()


def test_points_list_is_keyed_by_the_btf_it_came_from(cache_home, tmp_path, monkeypatch):
    """The list-devices list made from one BTF directory (a test's own) is not served for another (the kernel's):
    the key is taken from the files the list was made from."""
    import bpf.btf
    from fcap.points.spec import list_points
    from test_btf import sample
    _vmlinux_blob()
    fake = tmp_path / "btf"
    fake.mkdir()
    (fake / "vmlinux").write_bytes(sample()[0].blob())
    monkeypatch.setattr(bpf.btf, "SYSFS_BTF", str(fake))
    monkeypatch.setattr(BTF, "_vmlinux", None)
    monkeypatch.setattr(BTF, "_modules", {})
    assert "fentry/skb_cmp" in {p.spec for p in list_points()}   # (a function of the sample BTF only)
    monkeypatch.setattr(bpf.btf, "SYSFS_BTF", "/sys/kernel/btf")
    monkeypatch.setattr(BTF, "_vmlinux", None)
    real = {p.spec for p in list_points()}
    assert "fentry/skb_cmp" not in real and "tp_btf/netif_receive_skb" in real


def test_names_remembered_up_to_the_bound_and_found_past_it(cache_home):
    """A run that looks up many names (a list of 1,000 functions) remembers the first MEMO_NAMES for the next start
    (the file is written again for each one remembered) and finds the others all the same, by the same ids."""
    from bpf import btf as btfmod
    _vmlinux_blob()
    names = [f.name for f in BTF.load(_vmlinux_blob(), name="vmlinux").funcs()][:btfmod.MEMO_NAMES + 300]
    code = ("import sys; from bpf.btf import BTF; b = BTF.vmlinux(); "
            "print(' '.join(str(b.find(n, 'func').id) for n in sys.argv[1:]))")
    env = dict(os.environ, XDG_CACHE_HOME=str(cache_home), PYTHONPATH=ROOT)
    runs = [subprocess.run([sys.executable, "-c", code, *names], env=env, capture_output=True, text=True,
                           check=True).stdout for _ in range(2)]
    fresh = BTF.load(_vmlinux_blob(), name="vmlinux")
    assert runs[0] == runs[1] == " ".join(str(fresh.find(n, "func").id) for n in names) + "\n"
    kept = (cache_home / "fcap" / "vmlinux-names.btfcache").read_bytes().decode(errors="replace").splitlines()
    assert len(kept) == btfmod.MEMO_NAMES, len(kept)
