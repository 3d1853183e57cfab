"""fcap.Packet: one packet at one point, as the API gives it (fcap.capture, fcap.read) and --json prints it. Its home
is below the capture (text floor) so that every output, the API's and the command's, builds and reads the one
type."""

from __future__ import annotations

from dataclasses import dataclass, field

from fcap.errors import FcapError


@dataclass
class Packet:
    """One packet at one point. From a capture: everything; from a file, what the file holds (pcap: no metadata,
    the fields fcap's comment carries are None)."""

    ts_ns: int                 # wall clock, nanoseconds since the epoch
    point: str | None          # the capture point, e.g. "tp_btf/net_dev_queue" (the pcapng interface name)
    data: bytes                # the captured bytes, from the link type's start
    orig_len: int              # the packet's length from there
    linktype: int              # LINKTYPE_* number: 1 EN10MB, 276 LINUX_SLL2, 101 RAW, ...
    # (--json writes the attributes from packet_id to stack as they are, in this order: fcap.text.jsonout)
    packet_id: int | None = None   # the pcapng packet id: one packet's records share it (frame.packet_id)
    skb: int | None = None     # the skb's address (the same skb at several points: one packet followed)
    pid: int | None = None     # thread group id of the task the point ran in
    tid: int | None = None
    comm: str | None = None
    ifindex: int | None = None
    netns: int | None = None   # the device's network namespace inode number
    netns_name: str | None = None  # the name of the device's network namespace (`ip netns`; docker:NAME)
    mark: int | None = None
    cgroup: int | None = None      # --context: the cgroup id of the packet's socket, else of the task
    cgroup_path: str | None = None   # its path in the cgroup2 hierarchy ("/system.slice/x.scope")
    container: str | None = None   # the container that path names, runtime:id ("docker:<64 hex>")
    pod: str | None = None         # the Kubernetes pod uid it names
    direction: str | None = None   # "in" or "out" where the point has one (epb_flags)
    queue: int | None = None       # the device queue at device-layer points (epb_queue)
    reason: str | None = None      # drop points: the drop reason's name (NO_SOCKET; None before Linux 5.17)
    location: str | None = None    # drop points: where the skb was freed (FUNC+0xOFF)
    nft_family: str | None = None  # --nft, a netfilter drop: the nftables table's family (inet, ip, ip6, ...)
    nft_table: str | None = None   # the table whose chain dropped it
    nft_chain: str | None = None   # the chain (the one holding the rule, also when jumped to)
    nft_rule: int | None = None    # the rule's handle (`nft -a list ruleset`); None when the policy decided
    nft_policy: str | None = None  # "drop" when the base chain's policy dropped it
    nft_netns: int | None = None   # --nft-netns: that table's network namespace (inode number, as netns)
    stack: tuple | None = None     # --stack: the kernel stack, FUNC+0xOFF per frame, innermost first (() unknown)
    verdict: tuple | None = None   # epb_verdict (type, value): (1, 2): eBPF TC, TC_ACT_SHOT at drop points
    dumps: dict = field(default_factory=dict)   # --dump PATH -> fcap.kernel.dumps.Dump (.value, .text(), .node())
    comment: str | None = None     # the pcapng comment fcap writes for the packet

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
