"""fcap: tcpdump for any point inside the Linux network stack.

    import fcap
    with fcap.capture("tp_btf/net_dev_queue", filter="icmp", count=4) as cap:
        for p in cap:
            print(p.point, p.ts_ns, p.comm, p.scapy().summary())
    for p in fcap.read("out.pcapng"): ...
    for b in fcap.batches("out.pcapng"): b.fields["dport"] ...   # numpy arrays, a row per packet

The API (capture, read, Packet, Capture) is imported on first use: `import fcap` stays cheap for the command."""

from fcap.errors import FcapError

__version__ = "0.1.0"
__all__ = ["Capture", "FcapError", "Packet", "__version__", "batches", "capture", "read"]
_API = ("Capture", "Packet", "batches", "capture", "read")


def __getattr__(name: str):
    if name == "pcapy":   # (pcapy-ng's live API at kernel points: `from fcap import pcapy`; the module is not named
        import importlib  # pcapy.py, so that no path holding fcap's own folder ever shadows pcapy-ng itself)
        return importlib.import_module(f"{__name__}.pcapy_compat")
    if name in _API:
        # (at first use, not at import: the package's modules import the package first, never the API)
        import importlib
        return getattr(importlib.import_module(f"{__name__}.api"), name)
    raise AttributeError(f"module 'fcap' has no attribute {name!r}")
