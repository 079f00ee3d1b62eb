"""Warm rank processes for local CPU cells: a zygote imports torch (with torch._dynamo, which DDP, FSDP and
every torch optimizer import on first use) and DeepSpeed once per sweep, then forks each rank of each cell.

Why: a local cell spent most of its wall time outside the timed steps, and most of that was every rank of
every cell importing the same libraries (bench/bench_cell_overhead.py: ~3.5 s of imports per rank, on a
9-15 s tiny cell). Forking from an interpreter that has them already makes that once per sweep.

What stays the same: every rank is still a new process, started for its cell and gone with it, with its own
process group, and it runs exactly `harness.worker.runner.run` — the timed step is untouched. The launchers do not
change either: they start a small *stub* per rank (the submitit task's `harness.launch.entry.submitit_entry`, or
`python -m harness.launch.entry`), and the stub, finding `HARNESS_PREFORK` in its environment, asks the zygote to
fork the rank instead of importing torch itself. The stub passes its stdout/stderr and a lifeline pipe, waits for
the rank's exit status and exits with it (a signal as the same signal), so launchers, timeouts, FailureWatch and the
crash/exit-code classification see what they saw before. If the stub dies (killed by a launcher, Ctrl-C), the lifeline
closes and the rank kills itself: no rank outlives its cell. Without a zygote (none started, or it cannot
be reached) the stub runs the rank itself, as before.

Only CPU profiles use it: forking a process that has initialised CUDA is not safe, and GPU nodes do not
pay the same relative price.

NOTE: the zygote never runs a torch operation (OpenMP's thread pool would not survive a fork) and checks,
before it serves, that importing left it with one Python thread.
"""

from __future__ import annotations

import array
import contextlib
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from harness.core.catalogue import FAMILY_MODULES
from harness.results.payload import Payload

SOCKET_ENV = "HARNESS_PREFORK"
"""`<host>:<pid>:<path>` of the zygote and its UNIX socket; set by `zygote()` for the launchers' children (a
process on another host, e.g. a SLURM task that inherited the variable, ignores it)"""
OFF_ENV = "HARNESS_NO_PREFORK"
PRELOAD_ENV = "HARNESS_PREFORK_PRELOAD"
"""more modules for the zygote to import, comma-separated (a sweep of `implementation: transformers` cells:
transformers and its model classes, which each rank would otherwise import for seconds)"""
"""set (to anything) to run every rank in a freshly started interpreter, as without a zygote"""
PRELOAD = (
    "torch",
    "torch.distributed",
    "torch._dynamo",
    "deepspeed",
    "harness.worker.runner",
    *FAMILY_MODULES,
    "harness.worker.meters.comm",
    "harness.worker.meters.memory",
    "harness.worker.meters.timing",
    "harness.worker.faults",
    "harness.worker.env",
)
READY_TIMEOUT_S = 120.0
"""how long a stub waits for a zygote that is still importing before it runs the rank itself (s)"""


# --------------------------------------------------------------------------------------------------
# the zygote


def serve(path: str) -> None:
    """Import PRELOAD, then fork one rank per request until the sweep that started us stops us (SIGTERM) or
    goes away; ranks still running then are killed and reaped before we exit."""
    import importlib

    extra = tuple(n for n in os.environ.get(PRELOAD_ENV, "").split(",") if n)
    for name in (*PRELOAD, *extra):
        try:
            importlib.import_module(name)
        except ImportError:  # DeepSpeed is optional for non-ZeRO sweeps
            pass
    if threading.active_count() != 1:
        raise SystemExit(f"prefork: {threading.active_count()} Python threads after imports; forking is unsafe")
    sys.stdout.flush()  # nothing the imports printed may sit in a buffer every rank would inherit
    sys.stderr.flush()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the sweep's to handle; it then stops us

    def stop(signum, frame):
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)
    owner = os.getppid()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    tmp = f"{path}.{os.getpid()}.tmp"
    listener.bind(tmp)
    listener.listen(64)
    os.rename(tmp, path)  # the socket appears only once the imports are done
    children: dict[int, socket.socket] = {}
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ)
    try:
        while os.getppid() == owner:
            for _ in sel.select(timeout=0.05):
                conn, _ = listener.accept()
                pid = _fork_rank(conn, listener)
                if pid is not None:
                    children[pid] = conn
            _reap(children)
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        for pid in children:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        for pid in children:
            with contextlib.suppress(OSError):
                os.waitpid(pid, 0)
        with contextlib.suppress(OSError):
            os.unlink(path)


def _reap(children: dict[int, socket.socket]) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = children.pop(pid, None)
        if conn is None:
            continue
        code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        with contextlib.suppress(OSError):
            conn.sendall(json.dumps({"exit": code}).encode() + b"\n")
        conn.close()


def _fork_rank(conn: socket.socket, listener: socket.socket) -> int | None:
    try:
        conn.settimeout(10.0)  # a stub that connects and dies before sending must not stall every later cell
        request, fds = _recv(conn)
        conn.settimeout(None)
    except (OSError, ValueError):
        conn.close()
        return None
    pid = os.fork()
    if pid:
        for fd in fds:
            os.close(fd)
        return pid
    # the rank
    code = 1
    try:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        listener.close()
        conn.close()
        out, err, lifeline = fds
        os.dup2(out, 1)
        os.dup2(err, 2)
        os.close(out)
        os.close(err)
        # as a cold rank would: a local sweep's tasks never see a Ctrl-C (the sweep cancels them), other ranks get
        # KeyboardInterrupt
        signal.signal(signal.SIGINT, signal.SIG_IGN if request.get("ignore_sigint") else signal.default_int_handler)
        _watch_lifeline(lifeline)
        with contextlib.suppress(OSError):  # into the stub's group, so a launcher's killpg reaches the rank too
            os.setpgid(0, request["pgid"])
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(request["cwd"])
        code = _run_rank(request)
    except BaseException:  # noqa: BLE001 - whatever happens, the fork must not return into the zygote's loop
        import traceback

        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _watch_lifeline(fd: int) -> None:
    """End this rank when its stub is gone (the pipe's write end closes with the stub, however it ends)."""

    def watch() -> None:
        while True:
            try:
                if not os.read(fd, 1):
                    break
            except InterruptedError:
                continue
            except OSError:
                break
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="prefork-lifeline", daemon=True).start()


def _run_rank(request: dict[str, Any]) -> int:
    import traceback

    from harness.worker.runner import run

    try:
        payload = Payload.model_validate(request["payload"])
        run(payload, **request["rank"], forked=True)  # recorded as env.prefork
    except BaseException:  # noqa: BLE001 - as `python -m harness.launch.entry`: the fragment has the details
        traceback.print_exc()
        return 1
    return 0


# --------------------------------------------------------------------------------------------------
# the stub side


def _send(sock: socket.socket, obj: dict, fds: list[int]) -> None:
    data = json.dumps(obj).encode()
    sock.sendmsg([len(data).to_bytes(8, "big")], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
    sock.sendall(data)


def _recv(sock: socket.socket) -> tuple[dict, list[int]]:
    fds = array.array("i")
    msg, anc, _, _ = sock.recvmsg(8, socket.CMSG_SPACE(16 * fds.itemsize))
    for level, kind, data in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[: len(data) - (len(data) % fds.itemsize)])
    if len(msg) != 8:
        raise ValueError("short header")
    size, buf = int.from_bytes(msg, "big"), b""
    while len(buf) < size:
        chunk = sock.recv(size - len(buf))
        if not chunk:
            raise ValueError("truncated request")
        buf += chunk
    return json.loads(buf), list(fds)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _connect(pid: int, path: str) -> socket.socket | None:
    deadline = time.time() + READY_TIMEOUT_S
    while True:
        if not _alive(pid):
            return None
        if os.path.exists(path):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.connect(path)
                return sock
            except OSError:
                sock.close()
        if time.time() > deadline:
            return None
        time.sleep(0.05)


def run_forked(payload: Payload, **rank: Any) -> int | None:
    """Have the zygote fork this rank and wait for it: its exit code (negative: the signal that ended it),
    or None when this rank is not to be forked (the caller then runs it itself): no zygote, switched off, a
    GPU cell (CUDA does not survive a fork), or inside a SLURM job (its tasks start their ranks cold)."""
    where = os.environ.get(SOCKET_ENV)
    if (
        not where
        or os.environ.get(OFF_ENV)
        or payload.cluster.device != "cpu"
        or os.environ.get("SUBMITIT_EXECUTOR") == "slurm"
    ):
        return None
    host, pid, path = where.split(":", 2)
    if host != socket.gethostname():
        return None
    sock = _connect(int(pid), path)
    if sock is None:
        return None
    read_end, write_end = os.pipe()  # the lifeline: this process holds the write end until it ends
    with sock:
        sys.stdout.flush()
        sys.stderr.flush()
        request = {
            "payload": payload.to_dict(),
            "rank": rank,
            "env": dict(os.environ),
            "cwd": os.getcwd(),
            "pgid": os.getpgid(0),
            # a local sweep's job blocks SIGINT in its tasks (launchers.launch_submitit); the rank does as its stub
            "ignore_sigint": signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, ())
            or signal.getsignal(signal.SIGINT) is signal.SIG_IGN,
        }
        try:
            _send(sock, request, [sys.stdout.fileno(), sys.stderr.fileno(), read_end])
        except OSError:
            return None
        finally:
            os.close(read_end)
        line = sock.makefile("rb").readline()
    os.close(write_end)
    if not line:  # the zygote died while the rank ran: its status is lost, and closing the lifeline ends it
        print("prefork: the zygote went away while this rank ran", file=sys.stderr)
        return 1
    return int(json.loads(line)["exit"])


def exit_like(code: int) -> None:
    """End this stub as the rank ended: the same exit code, or the same signal."""
    sys.stdout.flush()
    sys.stderr.flush()
    if code < 0:
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
        time.sleep(1.0)
    os._exit(code if code >= 0 else 128 - code)


# --------------------------------------------------------------------------------------------------
# the sweep side


@contextlib.contextmanager
def zygote(env: dict[str, str] | None = None, *, label: str = "", log: Path | None = None) -> Iterator[str | None]:
    """Start a zygote for the duration of a local CPU sweep and point this process's children at it (sets
    SOCKET_ENV). Yields SOCKET_ENV's value. It imports in the background: the first cell's stubs wait for it.
    `label` (the sweep's results folder) goes on its command line, which its ranks share, so that `ps` shows
    whose ranks they are. `log`: where its own output goes (what the libraries print as they import, e.g.
    DeepSpeed's "Setting accelerator to CPU"), appended; None: this process's stdout and stderr. Each rank's output
    still goes where its stub's does."""
    if os.environ.get(SOCKET_ENV) or os.environ.get(OFF_ENV):
        yield os.environ.get(SOCKET_ENV)  # an outer sweep's (tests), or switched off
        return
    folder = tempfile.mkdtemp(prefix="harness-prefork-")
    path = str(Path(folder) / "zygote.sock")
    child_env = dict(os.environ, **(env or {}))
    # NOTE: its own process group (a terminal's Ctrl-C is not for it), in this session (so that a rank can join
    # its stub's group)
    out = None
    if log is not None:
        log.parent.mkdir(parents=True, exist_ok=True)
        out = open(log, "ab")  # noqa: SIM115 - the child holds it; closed below once it has started
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "harness.launch.local.prefork", path] + ([label] if label else []),
            env=child_env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT if out is not None else None,
            process_group=0,
        )
    finally:
        if out is not None:
            out.close()
    os.environ[SOCKET_ENV] = f"{socket.gethostname()}:{proc.pid}:{path}"
    try:
        yield os.environ[SOCKET_ENV]
    finally:
        os.environ.pop(SOCKET_ENV, None)
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        with contextlib.suppress(OSError):
            os.unlink(path)
        with contextlib.suppress(OSError):
            os.rmdir(folder)


if __name__ == "__main__":
    serve(sys.argv[1])
