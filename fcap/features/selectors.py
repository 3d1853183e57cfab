"""The in-kernel predicates of one value each (--pid, --comm, --mark, --ifindex, --ifname, --netns, --queue), each
one unit: the Config field and API keyword, the command line's flag (its metavar and help), the value's type and least
number, and the program's test, the function of that name in fcap.kernel.predicates (imported only when a capture
asks for one: a plain capture's start-up does not load it). The command line (fcap.commands.cli and capture), the
API (fcap.api), the planner (fcap.live.planner.PREDICATES) and fcap.kernel.predicates.factories read them here, in
this order: the order the programs test them in, cheap first."""

from __future__ import annotations

from typing import NamedTuple


class Selector(NamedTuple):
    name: str            # Config field, API keyword, and the test's name in fcap.kernel.predicates
    flag: str
    metavar: str
    help: str
    kind: type           # int or str
    least: int | None    # an int's least value
    per_point: bool = False   # the test depends on the point (no program shared by several: fcap.live.multi)


SELECTORS = (
    Selector("pid", "--pid", "PID", "only packets handled in process PID (thread group id)", int, 0),
    Selector("comm", "--comm", "NAME", "only packets handled by a task called NAME", str, None),
    Selector("mark", "--mark", "MARK", "only packets with skb->mark == MARK", int, 0),
    Selector("ifindex", "--ifindex", "N", "only packets on the device with index N", int, 1),
    Selector("ifname", "--ifname", "NAME", "only packets on the device called NAME", str, None),
    Selector("netns", "--netns", "INUM", "only packets of devices in network namespace INUM", int, 1),
    Selector("queue", "--queue", "N", "only packets of device queue N (device-layer points: the transmit queue "
             "picked, the receive queue a driver recorded; as frame.interface_queue)", int, 0, per_point=True),
)
NAMES = tuple(s.name for s in SELECTORS)
