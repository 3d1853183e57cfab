"""The kernel half of a capture session: each group's program loaded, then attached at its points (one link, or a
multi-attach group's); what the kernel refuses skipped where a glob allows it, else explained in one line."""

from __future__ import annotations

import re
import time

from bpf.errors import BPFError, PointerKindError, VerifierError
from bpf.link import Link
from bpf.prog import Program, load

from fcap.errors import CaptureError
from fcap.kernel import program as cprog
from fcap.kernel import variants
from fcap.live import multi
from fcap.points import pointcaps
from fcap.points.spec import Point, suggestion


class KernelRefusal(CaptureError):
    """The kernel refuses this kind of program altogether (every point of a glob would be refused alike)."""


class ProgramRefused(CaptureError):
    """The verifier (or fcap's pointer-kind check, before it) refused a program: `reason` is its one line."""

    def __init__(self, message: str, reason: str):
        super().__init__(message)
        self.reason = reason


def _explain_refusal(point: Point, e: BPFError) -> str:
    """The kernel's refusal to load or attach at `point`, in one line (its kind says how), with the tracepoint
    that sees the same packets."""
    return point.kind.explain(point, e, suggestion(point.name))


class Attach:
    """Loading and attaching, for fcap.live.session.Session (its points, groups, programs, links, skipped)."""

    def _load_all(self, maps: cprog.Maps) -> None:
        """A program per group (a point, or a multi-attach group whose program takes the point id from the attach
        cookie). A glob's match that the kernel (or a predicate) refuses is skipped and noted in self.skipped; a
        group the kernel refuses falls back to a program per point. The points kept are numbered again in the
        order loaded. A refusal of every match is the error."""
        kept: list[Point] = []
        first_error: CaptureError | None = None
        todo = list(self.groups)
        loaded: list[tuple[multi.Group, Program]] = []
        while todo:
            group = todo.pop(0)
            start = len(kept)
            for i, p in enumerate(group.points):
                p.id = start + i
            try:
                target = group.points[0] if group.kind is None else multi.stand_in(group.kind, group.points)
                prog = self._load_preferred(target, maps)
            except KernelRefusal:
                raise
            except CaptureError as e:
                if group.kind is not None:   # a program per point, then
                    todo[:0] = [multi.Group(None, [p]) for p in group.points]
                    continue
                p = group.points[0]
                if not p.origin:
                    raise
                first_error = first_error or e
                self.skipped.append((p.spec, str(e)))
                continue
            self.programs.append(prog)
            loaded.append((group, prog))
            kept += group.points
        if not kept and first_error is not None:
            raise first_error
        self.points = kept
        self.loaded = loaded

    def _load_preferred(self, p: Point, maps: cprog.Maps) -> Program:
        """The program for `p`; where it is refused, the first conservative variant (fcap.kernel.variants) that
        loads, given up for the rest of the session and noted in self.fallbacks. The first refusal is the error when
        none loads."""
        try:
            return self._load(p, self.build(p, maps))
        except ProgramRefused as first:
            before = set(self.given_up)
            for v in variants.applicable(self.options(p)):
                self.given_up.add(v.option)
                try:
                    prog = self._load(p, self.build(p, maps))
                except ProgramRefused:
                    continue
                self.fallbacks.setdefault(v.option, f"{p.spec}: {v.what}: the preferred program was refused "
                                                    f"({first.reason})")
                return prog
            self.given_up = before
            raise first

    def _load(self, p: Point, items: list) -> Program:
        name = re.sub(r"[^A-Za-z0-9_.]", "_", f"fcap_{p.name}")[:15]   # (the characters the kernel takes)
        refused = p.kind.refusal(p, suggestion(p.name))
        if refused is not None:
            raise KernelRefusal(refused)
        try:
            if p.typed:
                with pointcaps.btf_obj_fd(p) as obj_fd:
                    return load(p.kind.prog_type, items, name=name, expected_attach_type=p.kind.attach_type,
                                attach_btf_id=p.btf_id, attach_btf_obj_fd=obj_fd, what=p.spec)
            return load(p.kind.prog_type, items, name=name, expected_attach_type=p.kind.load_attach_type(),
                        what=p.spec)
        except PointerKindError as e:   # (found before the kernel saw it: a program some verifiers refuse)
            raise ProgramRefused(f"{p.spec}: fcap's check refused the capture program: {e} "
                                 f"(--dump-ebpf shows the program)", str(e)) from None
        except VerifierError as e:
            raise ProgramRefused(f"{p.spec}: the verifier rejected the capture program: {e.detail} "
                                 f"(--dump-ebpf shows the program)", e.detail) from None
        except BPFError as e:
            raise CaptureError(_explain_refusal(p, e)) from None

    def attach(self) -> None:
        """Attach every program. A glob's match the kernel will not attach is skipped (self.skipped) unless the
        kernel attaches none of a glob's matches."""
        attached: set[str] = set()
        refused: dict[str, str] = {}   # glob -> why its first match was refused
        names = multi.traceable() if any(u.kind is not None for u, _p in self.loaded) else None   # (once)
        try:
            for group, prog in self.loaded:
                if group.kind is not None:
                    self._attach_group(group, prog, attached, refused, names)
                    continue
                p = group.points[0]
                try:
                    self.links.append(self._attach_one(p, prog))
                    attached.add(p.origin)
                except BPFError as e:
                    if not p.origin:
                        raise CaptureError(_explain_refusal(p, e)) from None
                    self._refused(p, _explain_refusal(p, e), refused)
        except BaseException:   # (an interrupt in a long attach too: nothing stays in the kernel)
            self.close()
            raise
        for origin, why in refused.items():
            if origin not in attached:
                self.close()
                raise CaptureError(why)
        for p, prog in self.helpers:
            try:
                self.links.append(self._attach_one(p, prog))
            except BPFError as e:
                self.close()
                raise CaptureError(f"packet ids: {_explain_refusal(p, e)}") from None
        self.attached_ns = time.time_ns()

    def _attach_group(self, group: multi.Group, prog: Program, attached: set, refused: dict,
                      names: set[str] | None) -> None:
        """One program at a group's functions (fcap.live.multi.attach): the functions the kernel refuses are
        skipped, each glob's only where it refuses all of them."""
        dropped = multi.attach(group.kind, prog.fileno(), group.points, self.links, names)
        out = {p.id for p, _why in dropped}
        for p, why in dropped:
            if not p.origin:
                raise CaptureError(f"{p.spec}: {why}")
            self._refused(p, f"{p.spec}: {why}", refused)
        attached.update(p.origin for p in group.points if p.id not in out)

    def _refused(self, p: Point, why: str, refused: dict) -> None:
        self.skipped.append((p.spec, why))
        self.unattached.add(p.id)
        refused.setdefault(p.origin, why)

    @staticmethod
    def _attach_one(p: Point, prog: Program) -> Link:
        return p.kind.attach(prog.fileno(), p)

    def detach(self) -> None:
        if self.links:
            self.detached_ns = time.time_ns()
        for link in self.links:
            link.close()
        self.links = []
