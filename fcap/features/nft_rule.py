"""--nft: at drop points, the nftables table, chain and rule handle that dropped each packet netfilter dropped,
matched in user space from the kernel's nftables trace events (fcap.host.nftrace; the session's Tracers: one per
network namespace, --nft-netns)."""

from __future__ import annotations

from fcap.features.drop_reason import drop_names
from fcap.features.unit import Annotator, PacketFeature, Setting, keyed_text
from fcap.files import linktypes

# What a netfilter drop's comment adds after the drop's reason and location: (text before, Packet attribute, style).
# A rule decided: its handle (`nft -a list ruleset`); the base chain's policy decided: nft_policy=drop, no rule.
# nft_netns: the table's network namespace (its inode number, as the record's netns) when it is not fcap's own.
COMMENT = ((" nft_family=", "nft_family", "str"), (" nft_table=", "nft_table", "str"),
           (" nft_chain=", "nft_chain", "str"), (" nft_rule=", "nft_rule", "dec64"),
           (" nft_policy=", "nft_policy", "str"), (" nft_netns=", "nft_netns", "dec64"))


class NftRules(Annotator):
    """The rule of each netfilter drop (tracer: the session's fcap.host.nftrace.Tracers; linktype: the records')."""

    def __init__(self, tracer, linktype: int, drops):
        from fcap.host.nftrace import is_netfilter_drop
        self.tracer, self.linktype, self.drops = tracer, linktype, drops
        self.is_netfilter_drop = is_netfilter_drop
        self._last: tuple = (None, {})    # (record, its values): each record matched once

    def values(self, rec) -> dict:
        if self.drops is None or rec.point not in self.drops.has_reason:
            return {}
        last, values = self._last
        if last is not rec:
            reason, location = self.drops.drop(rec)
            values = {}
            if self.is_netfilter_drop(reason, location):
                d = self.tracer.attribute(linktypes.network_header(bytes(rec.data), self.linktype), rec.mark, rec.ts_ns,
                                          rec.netns)
                values = d.values() if d is not None else {}
            self._last = (rec, values)
        return values

    def text(self, rec) -> str:
        return keyed_text(COMMENT, self.values(rec))


def _annotator(session) -> NftRules | None:
    if session.nft is None:
        return None
    return NftRules(session.nft, session.linktype.number if session.linktype is not None else 0,
                    drop_names(session.points))


def _refuse(points) -> str:
    from fcap.kernel.drops import is_drop_point
    if any(is_drop_point(p) for p in points):
        return ""
    return "names the nftables rule of each netfilter drop: capture at a drop point (-i skb:drop, tp_btf/kfree_skb)"


FEATURE = PacketFeature(
    "nft", comment=COMMENT, flag="--nft", room="nftables rules",
    help="at drop points, the nftables table, chain and rule handle that dropped each packet netfilter dropped (fcap "
         "adds table inet fcap_nftrace_PID to this netns while it runs)",
    settings=(Setting("--nft-netns", "nft_netns", "NETNS",
                      "--nft in network namespace NETNS too (a name of `ip netns list`, docker's, a path such as a "
                      "pod's /proc/PID/ns/net, or all: every one found); its table added there (repeatable)"),),
    annotator=_annotator, refuse=_refuse, user_space=lambda cfg, points: cfg.nft,
    whole_record=True)   # (matched by its bytes)
