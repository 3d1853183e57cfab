"""--dump PATH and --ct: what the kernel held for each packet (an argument, a member chain, `return` at fexit; --ct
the skb's conntrack entry), copied by the capture program into the record (fcap.kernel.dumps) and shown typed from
BTF: printed under the line, a Packet's `dumps`, and in pcapng a comment and a custom option per dump (which
fcap's reader turns back into Dumps)."""

from __future__ import annotations

from fcap.features.unit import Annotator, PacketFeature, Shorthand


class Dumps(Annotator):
    def values(self, rec) -> dict:
        return {"dumps": {d.path: d for d in rec.dumps}}

    def below(self, printer, rec) -> None:
        if rec.dumps:
            printer.dumps(rec.dumps)

    def options(self, rec) -> dict:
        from fcap.kernel import dumps
        comments, more = dumps.records_options(rec.dumps)
        return {"comments": comments, "more": more}


FEATURE = PacketFeature(
    "dump", flag="--dump", metavar="PATH", room="dumps", program=("dumps",),
    help="an argument, a member chain ('skb->dev', 'skb->sk->__sk_common') or return (fexit), copied per packet and "
         "shown typed (repeatable)",
    shorthands=(Shorthand("--ct", "ct", "ct", "conntrack entry",
                          "copy each packet's conntrack entry (skb->_nfct: struct nf_conn, with its state, zone, mark, "
                          "original and reply tuples: NAT per packet) as a dump named ct"),),
    annotator=lambda session: Dumps() if session.cfg.dump else None,
    # (into a file: the perf buffer's drain, its blocks cached by each record's dump area too: FileDrain's lead)
    user_space=lambda cfg, points: bool(cfg.dump))
