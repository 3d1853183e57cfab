"""--nft: at drop points, the nftables table, chain and rule handle that dropped each packet netfilter dropped: the
drop point's program records the rule's key, which the trace socket's program found (fcap.kernel.nftverdict,
fcap.kernel.nftfilter), and user space names each key once from its trace event (fcap.host.nftrace; the session's
Tracers: one per network namespace, --nft-netns)."""

from __future__ import annotations

from fcap.features.unit import Annotator, PacketFeature, Setting, keyed_text

# What a netfilter drop's comment adds after the drop's reason and location: (text before, Packet attribute, style).
# A rule decided: its handle (`nft -a list ruleset`); the base chain's policy decided: nft_policy=drop, no rule.
# nft_netns: the table's network namespace (its inode number, as the record's netns) when it is not fcap's own.
COMMENT = ((" nft_family=", "nft_family", "str"), (" nft_table=", "nft_table", "str"),
           (" nft_chain=", "nft_chain", "str"), (" nft_rule=", "nft_rule", "dec64"),
           (" nft_policy=", "nft_policy", "str"), (" nft_netns=", "nft_netns", "dec64"))


class NftRules(Annotator):
    """The rule of each netfilter drop (tracer: the session's fcap.kernel.nftfilter.Rules)."""

    def __init__(self, tracer):
        self.tracer = tracer

    def values(self, rec) -> dict:
        if not rec.nft_key:
            return {}
        d = self.tracer.decision(rec.nft_key)
        return d.values() if d is not None else {}

    def text(self, rec) -> str:
        return keyed_text(COMMENT, self.values(rec))


def rule_text(decision) -> str:
    """The comment's text of a rule (a fcap.host.nftrace.Decision): what the programs write when given it."""
    return keyed_text(COMMENT, decision.values())


def _annotator(session) -> NftRules | None:
    return NftRules(session.nft) if session.nft is not None else None


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
    program=("nft verdict",), annotator=_annotator, refuse=_refuse)
