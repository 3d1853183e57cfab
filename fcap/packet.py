"""fcap.Packet: one packet at one point, as the API gives it (fcap.capture, fcap.read) and --json prints it. Its home
is below the capture (text floor) so that every output, the API's and the command's, builds and reads the one
type."""

from __future__ import annotations

from dataclasses import field, make_dataclass

from fcap.errors import FcapError
from fcap.kernel.record import FIELDS

# Packet's attributes, each (name, type, default, what it holds). The record's own (skb, pid, ..., queue) are
# declared with its fields (fcap.kernel.record: those whose Attr says packet), in the comment's order and then META's;
# --json writes the attributes from packet_id to stack as they are, in this order (fcap.text.jsonout).
_NONE = "int | None"
_FRONT = (
    ("ts_ns", "int", None, "wall clock, nanoseconds since the epoch"),
    ("point", "str | None", None, 'the capture point, e.g. "tp_btf/net_dev_queue" (the pcapng interface name)'),
    ("data", "bytes", None, "the captured bytes, from the link type's start"),
    ("orig_len", "int", None, "the packet's length from there"),
    ("linktype", "int", None, "LINKTYPE_* number: 1 EN10MB, 276 LINUX_SLL2, 101 RAW, ..."),
    ("packet_id", _NONE, None, "the pcapng packet id: one packet's records share it (frame.packet_id)"),
)
_RECORD = tuple((a.name, "str | None" if a.style == "str" else _NONE, None, a.doc)
                for keyed in (True, False) for f in FIELDS for a in f.attrs if a.packet and bool(a.key) == keyed)
_BACK = (
    ("netns_name", "str | None", None, "the name of the device's network namespace (`ip netns`; docker:NAME)"),
    ("cgroup_path", "str | None", None, '--context: its path in the cgroup2 hierarchy ("/system.slice/x.scope")'),
    ("container", "str | None", None, 'the container that path names, runtime:id ("docker:<64 hex>")'),
    ("pod", "str | None", None, "the Kubernetes pod uid it names"),
    ("direction", "str | None", None, '"in" or "out" where the point has one (epb_flags)'),
    ("reason", "str | None", None, "drop points: the drop reason's name (NO_SOCKET; None before Linux 5.17)"),
    ("location", "str | None", None, "drop points: where the skb was freed (FUNC+0xOFF)"),
    ("nft_family", "str | None", None, "--nft, a netfilter drop: the nftables table's family (inet, ip, ip6, ...)"),
    ("nft_table", "str | None", None, "the table whose chain dropped it"),
    ("nft_chain", "str | None", None, "the chain (the one holding the rule, also when jumped to)"),
    ("nft_rule", _NONE, None, "the rule's handle (`nft -a list ruleset`); None when the policy decided"),
    ("nft_policy", "str | None", None, '"drop" when the base chain\'s policy dropped it'),
    ("nft_netns", _NONE, None, "--nft-netns: that table's network namespace (inode number, as netns)"),
    ("stack", "tuple | None", None, "--stack: the kernel stack, FUNC+0xOFF per frame, innermost first (() unknown)"),
    ("verdict", "tuple | None", None, "epb_verdict (type, value): (1, 2): eBPF TC, TC_ACT_SHOT at drop points"),
    ("dumps", "dict", dict, "--dump PATH -> fcap.kernel.dumps.Dump (.value, .text(), .node())"),
    ("comment", "str | None", None, "the pcapng comment fcap writes for the packet"),
)
ATTRIBUTES = _FRONT + _RECORD + _BACK


class _PacketMethods:
    """Packet's methods (Packet is made from ATTRIBUTES below)."""

    def scapy(self):
        """The packet as a scapy packet (scapy must be installed: pip install 'fcap[decode]')."""
        try:
            from scapy import all as scapy
        except ImportError as e:
            raise FcapError(f"Packet.scapy() needs scapy: pip install 'fcap[decode]' ({e})") from None
        from fcap.text.show import scapy_class
        return scapy_class(scapy, self.data, self.linktype)(bytes(self.data))

    def dpkt(self):
        """The packet as a dpkt object of its link type (Ethernet, SLL2, SLL, IP, IP6)."""
        import dpkt

        from fcap.files import linktypes
        kinds = {linktypes.EN10MB.number: dpkt.ethernet.Ethernet, linktypes.LINUX_SLL.number: dpkt.sll.SLL,
                 linktypes.LINUX_SLL2.number: dpkt.sll2.SLL2, linktypes.IPV4.number: dpkt.ip.IP,
                 linktypes.IPV6.number: dpkt.ip6.IP6}
        cls = kinds.get(self.linktype)
        if cls is None and self.linktype == linktypes.RAW.number:
            cls = dpkt.ip6.IP6 if self.data[:1] and self.data[0] >> 4 == 6 else dpkt.ip.IP
        if cls is None:
            raise FcapError(f"Packet.dpkt(): no dpkt class for link type {self.linktype}")
        return cls(bytes(self.data))


def _spec(name: str, kind: str, default, _doc: str) -> tuple:
    if name in ("ts_ns", "point", "data", "orig_len", "linktype"):
        return name, kind
    return name, kind, field(default_factory=default) if default is dict else field(default=default)


_DOC = ("One packet at one point. From a capture: everything; from a file, what the file holds (pcap: no metadata, "
        "the fields fcap's comment carries are None).\n\nAttributes:\n"
        + "".join(f"    {name}: {doc}\n" for name, _k, _d, doc in ATTRIBUTES))
Packet = make_dataclass("Packet", [_spec(*a) for a in ATTRIBUTES], bases=(_PacketMethods,),
                        namespace={"__module__": __name__, "__doc__": _DOC})
