"""-Z USER, as tcpdump does it: once the programs are attached and the output is open, the capture goes on as
USER (its uid, gid and supplementary groups; no capabilities left), and the output file belongs to USER."""

from __future__ import annotations

import os
import pwd
import stat

from fcap.errors import UsageError


def lookup(name: str) -> pwd.struct_passwd:
    try:
        return pwd.getpwnam(name)
    except KeyError:
        raise UsageError(f"-Z {name}: no such user") from None


def give_output(fd: int, user: pwd.struct_passwd) -> None:
    """A regular output file is USER's, as if USER had created it."""
    if fd >= 0 and stat.S_ISREG(os.fstat(fd).st_mode):
        os.fchown(fd, user.pw_uid, user.pw_gid)


def drop_to(user: pwd.struct_passwd) -> None:
    """Become USER for good: supplementary groups, gid, then uid (which clears every capability)."""
    os.setgroups(os.getgrouplist(user.pw_name, user.pw_gid))
    os.setgid(user.pw_gid)
    os.setuid(user.pw_uid)


def may_create_in(directory: str, user: pwd.struct_passwd) -> bool:
    """Whether USER may create files in DIRECTORY (-C/-G make their later files as USER): asked of the kernel by
    a child that becomes USER, so that every ancestor, ACL and group counts."""
    pid = os.fork()
    if pid == 0:
        try:
            drop_to(user)
            os._exit(0 if os.access(directory, os.W_OK | os.X_OK) else 1)
        except BaseException:
            os._exit(2)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) == 0
