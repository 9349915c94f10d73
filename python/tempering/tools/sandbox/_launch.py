"""The local sandbox's launcher: applies the isolation to itself, then execs the command.

Run by :class:`~tempering.tools.sandbox.LocalSandbox` as ``python -I -S _launch.py CONFIG_JSON``
(stdlib only, no site: a fresh single-threaded interpreter, so nothing runs between ``fork`` and
``exec`` in the caller). Each step that succeeds is named on the status pipe (a JSON line) before
``exec``; a required step that fails writes ``{"error": ...}`` there and exits 125.
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import sys

CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
AT_FDCWD = -100
AT_RECURSIVE = 0x8000
MOUNT_ATTR_RDONLY = 0x1
SYS_MOUNT_SETATTR = 442  # x86_64 and aarch64 share it (new syscalls are numbered alike)
PR_SET_NO_NEW_PRIVS = 38


class _MountAttr(ctypes.Structure):
    _fields_ = [
        ("attr_set", ctypes.c_uint64),
        ("attr_clr", ctypes.c_uint64),
        ("propagation", ctypes.c_uint64),
        ("userns_fd", ctypes.c_uint64),
    ]


_libc = ctypes.CDLL(None, use_errno=True)


def _check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _unshare(flags: int, what: str) -> None:
    _check(_libc.unshare(ctypes.c_int(flags)), what)


def _mount(source: str | None, target: str, flags: int, what: str) -> None:
    src = None if source is None else source.encode()
    _check(_libc.mount(src, target.encode(), None, ctypes.c_ulong(flags), None), what)


def _setattr(path: str, attr_set: int, attr_clr: int, what: str) -> None:
    attr = _MountAttr(attr_set, attr_clr, 0, 0)
    ret = _libc.syscall(
        ctypes.c_long(SYS_MOUNT_SETATTR),
        ctypes.c_int(AT_FDCWD),
        ctypes.c_char_p(path.encode()),
        ctypes.c_uint(AT_RECURSIVE),
        ctypes.byref(attr),
        ctypes.c_size_t(ctypes.sizeof(attr)),
    )
    _check(ret, what)


def _read_only_except(workdir: str) -> None:
    """A private mount namespace where every mount is read-only except ``workdir``."""
    _unshare(CLONE_NEWNS, "unshare(CLONE_NEWNS)")
    _mount(None, "/", MS_REC | MS_PRIVATE, "make / private")
    _mount(workdir, workdir, MS_BIND | MS_REC, "bind the work directory")
    _setattr("/", MOUNT_ATTR_RDONLY, 0, "make every mount read-only")
    _setattr(workdir, 0, MOUNT_ATTR_RDONLY, "make the work directory writable")


def _limits(config: dict[str, int]) -> None:
    cpu = config["cpu_seconds"]
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    resource.setrlimit(resource.RLIMIT_AS, (config["memory_bytes"], config["memory_bytes"]))
    resource.setrlimit(resource.RLIMIT_FSIZE, (config["max_file_bytes"], config["max_file_bytes"]))
    resource.setrlimit(resource.RLIMIT_NOFILE, (config["max_open_files"], config["max_open_files"]))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if config.get("nproc") is not None:
        resource.setrlimit(resource.RLIMIT_NPROC, (config["nproc"], config["nproc"]))


def _which(name: str, path: str) -> str:
    """``name`` looked up on ``path`` as the (possibly dropped) user; ``name`` itself if it has a slash."""
    if "/" in name:
        return name
    for directory in path.split(os.pathsep):
        candidate = os.path.join(directory, name)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    raise FileNotFoundError(2, f"not found on PATH {path!r}")


def main() -> None:
    config = json.loads(sys.argv[1])
    status_fd: int = config["status_fd"]
    workdir: str = config["workdir"]
    applied: list[str] = []
    failed: dict[str, str] = {}
    required = set(config["require"])

    def step(name: str, fn: object) -> None:
        try:
            fn()  # type: ignore[operator]
            applied.append(name)
        except OSError as e:
            failed[name] = str(e)
            if name in required:
                os.write(status_fd, (json.dumps({"error": f"{name}: {e}"}) + "\n").encode())
                os._exit(125)

    if config.get("cgroup_procs"):

        def join_cgroup() -> None:
            with open(config["cgroup_procs"], "w") as f:
                f.write(str(os.getpid()))

        step("pids_cgroup", join_cgroup)
    is_root = os.geteuid() == 0
    if not config["network"]:
        flags = CLONE_NEWNET if is_root else CLONE_NEWUSER | CLONE_NEWNET
        step("no_network", lambda: _unshare(flags, "unshare(CLONE_NEWNET)"))
    if config["read_only_outside"] and is_root:
        step("read_only_outside", lambda: _read_only_except(workdir))
    elif config["read_only_outside"]:
        failed["read_only_outside"] = "needs root (a mount namespace)"
    step("rlimits", lambda: _limits(config))
    os.chdir(workdir)
    uid = config.get("uid")
    if uid is not None:

        def drop() -> None:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)

        step("own_uid", drop)
    step("no_new_privs", lambda: _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl"))
    os.write(status_fd, (json.dumps({"applied": applied, "failed": failed}) + "\n").encode())
    os.close(status_fd)
    argv: list[str] = config["argv"]
    try:
        os.execve(_which(argv[0], config["env"].get("PATH", "")), argv, config["env"])
    except OSError as e:
        sys.stderr.write(f"tempering sandbox: cannot run {argv[0]!r}: {e}\n")
        os._exit(127)


if __name__ == "__main__":
    main()
