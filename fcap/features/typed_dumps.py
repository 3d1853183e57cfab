"""--dump PATH and --ct: what the kernel held for each packet (an argument, a member chain, `return` at fexit; --ct
the skb's conntrack entry), copied by the capture program into the record (fcap.kernel.dumps) and shown typed from
BTF: printed under the line, a Packet's `dumps`, and in pcapng a comment and a custom option per dump (which
fcap's reader turns back into Dumps)."""

from __future__ import annotations

from fcap.features.unit import Annotator, PacketFeature, Shorthand
from fcap.kernel.layout import RECORD_PCAPNG


class Dumps(Annotator):
    """A record's dumps; where the programs write the file rings (`given`: fcap.kernel.dumps.GivenOptions), each
    record's options made are given to them too, under its hash of the dumps: they write them into the records of
    the same hash after it themselves."""

    def __init__(self, given=None):
        self.given = given

    def values(self, rec) -> dict:
        return {"dumps": {d.path: d for d in rec.dumps}}

    def below(self, printer, rec) -> None:
        if rec.dumps:
            printer.dumps(rec.dumps)

    def options(self, rec) -> dict:
        from fcap.kernel import dumps
        comments, more = dumps.records_options(rec.dumps)
        if self.given is not None:
            self.given.give(rec.dump_key, comments, more)
        return {"comments": comments, "more": more}


FEATURE = PacketFeature(
    "dump", flag="--dump", metavar="PATH", room="dumps", program=("dumps",),
    help="an argument, a member chain ('skb->dev', 'skb->sk->__sk_common') or return (fexit), copied per packet and "
         "shown typed (repeatable)",
    shorthands=(Shorthand("--ct", "ct", "ct", "conntrack entry",
                          "copy each packet's conntrack entry (skb->_nfct: struct nf_conn, with its state, zone, mark, "
                          "original and reply tuples: NAT per packet) as a dump named ct"),),
    annotator=lambda session: Dumps(session.dump_options) if session.cfg.dump else None,
    # (into a pcapng file with comments, where the programs write the file rings: they write the dumps' options too,
    # as user space gives them (fcap.kernel.dumps.GivenOptions); else the perf buffer's blocks, cached by each
    # record's dump area too: FileDrain's lead)
    user_space=lambda cfg, points: bool(cfg.dump) and not _rings(cfg, points))


def _rings(cfg, points) -> bool:
    """Whether the programs may write the dumps' options into the file rings: pcapng with comments, options short
    enough."""
    from fcap.kernel.dumps import fit_rings
    return cfg.comment and cfg.record == RECORD_PCAPNG and fit_rings(points, list(cfg.dump))
