"""Dispatch: turn RunSpecs into jobs (submitit: local or SLURM), keep a sweep manifest, and make sure
every cell ends with exactly one record — written by rank 0, or composed here from the ranks' failure
fragments, the job's state and its logs when rank 0 could not write it.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from contextlib import ExitStack, contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.launch.local import prefork
from harness.scenario.cluster import Cluster
from harness.worker.env import git_sha
from harness.results.store import (atomic_write_json, new_record, read_record, record_path, sweep_dir, utc_now,
                             write_record)
from harness.scenario.schema import RunSpec, Scenario

FAILED = ("oom", "timeout", "error", "nan", "crashed", "cancelled")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def predict(spec: RunSpec, cluster: Cluster) -> dict | None:
    """The planner's prediction for a cell, or None while no planner is installed."""
    try:
        from harness.plan.predict import predict as _predict
    except ImportError:
        return None
    try:
        return _predict(spec, cluster)
    except Exception as e:  # noqa: BLE001 - a planner bug must not cost the measurement; it is reported
        print(f"warning: planner failed for {spec.run_id}: {type(e).__name__}: {e}", file=sys.stderr)
        return None


def make_payload(spec: RunSpec, *, sweep: str, cluster: Cluster, results: str | Path, sha: str | None,
                 predicted: dict | None) -> dict[str, Any]:
    """Everything a rank needs, as plain JSON data (pickled by submitit, or written to a file)."""
    return {
        "spec": spec.to_dict(),
        "run_id": spec.run_id,
        "sweep": sweep,
        "attempt": uuid.uuid4().hex[:12],
        "results": str(Path(results).resolve()),
        "cluster": {"name": cluster.name, "device": cluster.device, "pg_timeout_s": cluster.pg_timeout_s,
                    "env": cluster.env},
        "git_sha": sha,
        "predicted": predicted,
        "master_port": free_port() if cluster.executor == "local" else None,
    }


# --------------------------------------------------------------------------------------------------
# the manifest: which cells a sweep has, their job ids and states


@contextmanager
def file_lock(path: Path, *, blocking: bool = True):
    """An exclusive flock on `path` (created if missing); yields False when non-blocking and already held."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


@dataclass
class Manifest:
    """`results/<sweep>/manifest.json`: each cell's state (pending/running/done/failed/skipped/cancelled, and
    submitted: queued on SLURM), status, job id and attempt (SLURM cells also slurm_state and nodes). Every
    update re-reads the file under a lock, so concurrent sweeps into the same dir interleave their updates
    instead of overwriting each other's."""

    path: Path
    header: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def open(cls, results: str | Path, sweep: str, *, scenario: str, cluster: str, executor: str = "local",
             run_ids: list[str] | None = None) -> "Manifest":
        m = cls(sweep_dir(results, sweep) / "manifest.json",
                {"sweep": sweep, "scenario": scenario, "cluster": cluster, "executor": executor})
        with m._locked() as data:
            for run_id in run_ids or []:
                data["cells"].setdefault(run_id, {"state": "pending", "updated_at": utc_now()})
        return m

    @contextmanager
    def _locked(self):
        with file_lock(self.path.with_name(".manifest.lock")):
            data: dict[str, Any] = {}
            if self.path.exists():
                try:
                    data = json.loads(self.path.read_text())
                except (OSError, json.JSONDecodeError):
                    data = {}
            data.update(self.header)
            data.setdefault("cells", {})
            yield data
            atomic_write_json(self.path, data)

    def set(self, run_id: str, **fields: Any) -> None:
        with self._locked() as data:
            cell = data["cells"].setdefault(run_id, {})
            cell.update(fields, updated_at=utc_now())

    @property
    def data(self) -> dict[str, Any]:
        return json.loads(self.path.read_text())


# --------------------------------------------------------------------------------------------------
# turning a finished job into exactly one record


def read_fragments(payload: dict) -> list[dict]:
    """The failure fragments the ranks of this attempt wrote."""
    from harness.worker.runner import fragment_dir

    d = fragment_dir(payload["results"], payload["sweep"], payload["run_id"])
    frags = []
    for p in sorted(d.glob("rank*.json")):
        try:
            frag = json.loads(p.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if frag.get("attempt") in (None, payload["attempt"]):
            frags.append(frag)
    return frags


def _fresh_record(payload: dict) -> dict | None:
    path = record_path(payload["results"], payload["sweep"], payload["run_id"])
    try:
        rec = read_record(path)
    except ValueError:
        return None
    return rec if rec.get("attempt") == payload["attempt"] else None


SECONDARY = ("connection closed", "connection reset", "broken pipe", "econnreset", "connection refused",
             "socket closed", "read error", "nccl communicator was aborted", "process group was aborted")
TIMEOUTS = ("timed out", "timeout", "watchdog")


def is_secondary(frag: dict) -> bool:
    """A rank that failed because another one did: its collective broke or timed out."""
    return any(k in frag["reason"].lower() for k in SECONDARY + TIMEOUTS)


def _exception_line(tb: str) -> str:
    lines = [line for line in tb.strip().splitlines() if line.strip() and not line.startswith(("-", " "))]
    return lines[-1][:500] if lines else tb.strip()[-500:]


def classify(frags: list[dict], *, world_size: int, elapsed_s: float, time_limit_s: float, cancelled: bool,
             exit_codes: list | None, pg_timeout_s: float | None, ended: tuple[str, str] | None = None,
             job_errors: dict[int, str] | None = None) -> tuple[str, str, int | None]:
    """(status, reason, failed rank) of a cell that ended without rank 0's record.

    The first rank to fail is the root cause. Ranks that left no fragment while others report a broken
    collective are the culprits: they died (the others saw their connection close) or hung (the others'
    collective hit the watchdog). `ended` is the scheduler's verdict when it explains the end (a time limit, a
    cancel, a node failure); `job_errors` are tracebacks the scheduler's tasks left when no fragment was written.
    """
    if cancelled:
        return "cancelled", "the job was cancelled before the cell finished", None
    if ended is not None:
        return ended[0], ended[1], None
    reported = {f["rank"] for f in frags}
    silent = sorted(set(range(world_size)) - reported)
    primary = [f for f in frags if not is_secondary(f)]
    if primary:
        first = min(primary, key=lambda f: f["time"])
        return first["status"], first["reason"], first["rank"]
    if frags:
        first = min(frags, key=lambda f: f["time"])
        culprit = silent[0] if silent else first["rank"]
        who = f"rank {', '.join(map(str, silent))}" if silent else f"rank {culprit}"
        if any(k in f["reason"].lower() for f in frags for k in TIMEOUTS):
            return ("timeout", f"collective timed out after the {pg_timeout_s:g} s watchdog: {who} stopped making "
                    f"progress (rank {first['rank']} reported: {first['reason'][:300]})", culprit)
        return ("crashed", f"{who} died without raising an exception; the others saw its connection close "
                f"(rank {first['rank']}: {first['reason'][:300]})", culprit)
    if job_errors:
        rank = min(job_errors)
        return "error", f"{_exception_line(job_errors[rank])} (rank {rank}, outside the benchmark)", rank
    if elapsed_s >= time_limit_s:
        return "timeout", f"the cell exceeded its time limit of {time_limit_s:g} s", None
    codes = f" (exit codes {exit_codes})" if exit_codes else ""
    return "crashed", f"the ranks exited without a record or an exception{codes}", None


def finalize(payload: dict, *, elapsed_s: float, time_limit_s: float, cancelled: bool = False,
             log_tail: str = "", exit_codes: list | None = None, ended: tuple[str, str] | None = None,
             job_errors: dict[int, str] | None = None) -> dict:
    """The cell's record: rank 0's if this attempt wrote one, else one composed from what is known
    (`ended`, `job_errors`: see classify)."""
    rec = _fresh_record(payload)
    if rec is not None:
        return rec
    spec = payload["spec"]
    frags = read_fragments(payload)
    status, reason, rank = classify(frags, world_size=spec["world_size"], elapsed_s=elapsed_s,
                                    time_limit_s=time_limit_s, cancelled=cancelled, exit_codes=exit_codes,
                                    pg_timeout_s=payload["cluster"].get("pg_timeout_s"), ended=ended,
                                    job_errors=job_errors)
    rec = new_record(spec=spec, run_id=payload["run_id"], sweep=payload["sweep"],
                     cluster=payload["cluster"]["name"], status=status, reason=reason, failed_rank=rank)
    rec["attempt"] = payload["attempt"]
    if payload.get("predicted") is not None:
        rec["predicted"] = payload["predicted"]
    if frags:
        rec["failures"] = [{k: f.get(k) for k in ("rank", "status", "reason", "hostname", "traceback",
                                                   "memory_allocated_gib", "memory_reserved_gib", "memory_rss_gib")} for f in frags]
    elif job_errors:
        rec["failures"] = [{"rank": k, "status": "error", "reason": _exception_line(tb), "traceback": tb[-8000:]}
                           for k, tb in sorted(job_errors.items())]
    if log_tail:
        rec["log_tail"] = log_tail[-4000:]
    rec["env"] = {"harness_git_sha": payload.get("git_sha"), "slurm_job_id": payload.get("job_id")}
    write_record(payload["results"], rec)
    return rec


def skipped_record(spec: RunSpec, *, sweep: str, cluster: Cluster, results: str | Path, reason: str,
                   predicted: dict | None) -> dict:
    rec = new_record(spec=spec.to_dict(), run_id=spec.run_id, sweep=sweep, cluster=cluster.name,
                     status="skipped", reason=reason)
    if predicted is not None:
        rec["predicted"] = predicted
    write_record(results, rec)
    return rec


# --------------------------------------------------------------------------------------------------
# launchers


def launch_foreground(payload: dict, *, time_limit_s: float, stream: bool = True) -> dict:
    """Run a cell's ranks as child processes of this one (no scheduler), torchrun-style environment.

    All ranks share a new process group, killed as a whole on timeout or Ctrl-C: no rank outlives its cell.
    """
    world = payload["spec"]["world_size"]
    with tempfile.TemporaryDirectory(prefix="harness-") as tmp:
        ppath = Path(tmp) / "payload.json"
        ppath.write_text(json.dumps(payload))
        procs = []
        base_env = dict(os.environ)
        base_env.update(payload["cluster"].get("env", {}))
        base_env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(payload["master_port"] or free_port()),
                        WORLD_SIZE=str(world), PYTHONUNBUFFERED="1")
        gpn = payload["spec"]["gpus_per_node"]
        # ranks' output is logs: to our stderr (stdout stays for results, e.g. `harness run --json`)
        out = sys.stderr if stream else subprocess.DEVNULL
        t0 = time.time()
        pgid = None
        for r in range(world):
            env = dict(base_env, RANK=str(r), LOCAL_RANK=str(r % gpn if payload["cluster"]["device"] == "cuda" else r))
            p = subprocess.Popen([sys.executable, "-m", "harness.worker.runner", str(ppath)], env=env,
                                 stdout=out, stderr=subprocess.STDOUT,
                                 process_group=pgid if pgid is not None else 0)
            pgid = p.pid if pgid is None else pgid
            procs.append(p)
        cancelled = False
        watch = FailureWatch(payload)
        try:
            while any(p.poll() is None for p in procs):
                if time.time() - t0 > time_limit_s or watch.stuck():
                    break
                time.sleep(0.1)
        except KeyboardInterrupt:
            cancelled = True
        finally:
            if any(p.poll() is None for p in procs):
                _kill_group(pgid)
                for p in procs:
                    p.wait()
        elapsed = time.time() - t0
        return finalize(payload, elapsed_s=elapsed, time_limit_s=time_limit_s, cancelled=cancelled,
                        exit_codes=[p.returncode for p in procs])


class FailureWatch:
    """A rank that failed leaves a fragment; ranks still alive `grace_s` later are stuck (a hung peer, a
    collective that will never complete): the launcher ends the cell instead of waiting for its time limit."""

    def __init__(self, payload: dict, grace_s: float = 15.0):
        self.payload, self.grace_s = payload, grace_s
        self.first_seen: float | None = None
        self._next_check = 0.0

    def stuck(self) -> bool:
        now = time.time()
        if now < self._next_check:
            return False
        self._next_check = now + 1.0
        if self.first_seen is None:
            if read_fragments(self.payload):
                self.first_seen = now
            return False
        return now - self.first_seen > self.grace_s


def _kill_tree(pid: int) -> None:
    """SIGTERM, then SIGKILL, a process and all its descendants (a local submitit job: controller + ranks)."""
    try:
        import psutil

        root = psutil.Process(pid)
        procs = root.children(recursive=True) + [root]
    except Exception:  # noqa: BLE001 - already gone
        return
    for p in procs:
        try:
            p.terminate()
        except Exception:  # noqa: BLE001
            pass
    _, alive = psutil.wait_procs(procs, timeout=3)
    for p in alive:
        try:
            p.kill()
        except Exception:  # noqa: BLE001
            pass
    psutil.wait_procs(alive, timeout=3)


def _kill_group(pgid: int | None) -> None:
    if pgid is None:
        return
    for sig, wait in ((signal.SIGTERM, 3.0), (signal.SIGKILL, 0.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        deadline = time.time() + wait
        while time.time() < deadline:
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.05)


def job_log_tail(job, n_tasks: int) -> str:
    """The end of each task's stderr (for records of cells that died without a fragment)."""
    tails = []
    for k in range(n_tasks):
        try:
            err = (job.task(k).stderr() if n_tasks > 1 else job.stderr()) or ""
        except Exception:  # noqa: BLE001 - a log that was never written
            continue
        if err.strip():
            tails.append(f"--- rank {k} stderr ---\n{err[-1500:]}")
    return "\n".join(tails)


def local_gpus() -> list[int] | None:
    """The GPUs a local sweep may use, by index: CUDA_VISIBLE_DEVICES when it lists indices, else every device
    torch sees; None when CUDA_VISIBLE_DEVICES names GPUs by UUID or MIG id (then nothing is checked)."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        items = [x.strip() for x in env.split(",") if x.strip()]
        return [int(x) for x in items] if all(x.isdigit() for x in items) else None
    import torch

    return list(range(torch.cuda.device_count()))


def local_executor_parameters(world: int, *, cluster: Cluster, time_limit_s: float) -> dict[str, Any]:
    """submitit LocalExecutor parameters of a local cell: one task per rank, one node."""
    # timeout_min bounds the whole job; the Controller then kills every task
    params: dict[str, Any] = {"tasks_per_node": world, "nodes": 1, "timeout_min": time_limit_s / 60.0,
                              "signal_delay_s": min(30, max(1, int(time_limit_s // 10)))}
    # NOTE: gpus_per_node also sets the tasks' CUDA_VISIBLE_DEVICES, to the first gpus_per_node of visible_gpus
    # (default 0, 1, ...: physical indices, which would ignore the user's CUDA_VISIBLE_DEVICES=2,3); 0 would hide
    # every GPU
    params["gpus_per_node"] = world if cluster.device == "cuda" else 0
    gpus = local_gpus() if cluster.device == "cuda" else None
    if gpus:
        params["visible_gpus"] = tuple(gpus)
    return params


def launch_submitit(payload: dict, *, cluster: Cluster, folder: Path, time_limit_s: float,
                    on_submit: Callable[[Any], None] | None = None) -> dict:
    """Run one cell as a local submitit job with one task per rank and wait for it (SLURM cells: harness.launch.slurm.jobs)."""
    import submitit

    from harness.worker.runner import submitit_entry

    world = payload["spec"]["world_size"]
    if cluster.executor != "local":
        raise ValueError(f"launch_submitit runs local cells; {cluster.name!r} is a {cluster.executor} profile")
    executor = submitit.LocalExecutor(folder=folder)
    executor.update_parameters(**local_executor_parameters(world, cluster=cluster, time_limit_s=time_limit_s))
    t0 = time.time()
    job = executor.submit(submitit_entry, payload)
    if on_submit:
        on_submit(job)
    watch = FailureWatch(payload)
    try:
        while not job.done():
            over = time.time() - t0 > time_limit_s + 15  # the controller's own kill is late or missing
            if over or watch.stuck():
                _kill_tree(int(job.job_id))
                break
            time.sleep(0.2)
    except KeyboardInterrupt:
        _kill_tree(int(job.job_id))
        finalize(payload, elapsed_s=time.time() - t0, time_limit_s=time_limit_s, cancelled=True)
        raise
    elapsed = time.time() - t0
    return finalize(payload, elapsed_s=elapsed, time_limit_s=time_limit_s, log_tail=job_log_tail(job, world))


# --------------------------------------------------------------------------------------------------
# sweeps


@dataclass
class SweepResult:
    records: list[dict]
    results_dir: Path
    wall_s: float
    in_flight: int = 0
    """cells left running on SLURM by a detached (--no-wait) sweep"""

    @property
    def failed(self) -> list[dict]:
        return [r for r in self.records if r["status"] in FAILED]


def existing_ok(results: str | Path, sweep: str, run_id: str) -> bool:
    try:
        return read_record(record_path(results, sweep, run_id))["status"] == "ok"
    except ValueError:
        return False


def run_sweep(scenario: Scenario, cluster: Cluster, *, results: str | Path, force: bool = False,
              no_skip: bool = False, only: set[str] | None = None, no_wait: bool = False, pack: bool = False,
              echo: Callable[[str], None] = print) -> SweepResult:
    """Run every cell of a scenario, each ending in one record: locally one after another; on SLURM all
    submitted at once (job arrays, or with `pack` one job per job shape running its cells back to back), then
    each finalized as it ends — or left running with `no_wait`."""
    t0 = time.time()
    results = Path(results)
    specs = scenario.expand(gpus_per_node=cluster.gpus_per_node)
    if only is not None:
        specs = [s for s in specs if s.run_id in only]
    if cluster.executor == "slurm":
        from harness.launch.slurm.jobs import preflight

        preflight(cluster)  # NOTE: before the manifest: a cluster that cannot take jobs leaves nothing behind
    elif no_wait or pack:
        raise ValueError(f"{'no_wait' if no_wait else 'pack'} needs a SLURM profile: local cells run as children of "
                         "the sweep")
    sha = git_sha()
    manifest = Manifest.open(results, scenario.name, scenario=scenario.path, cluster=cluster.name,
                             executor=cluster.executor, run_ids=[s.run_id for s in specs])
    folder = sweep_dir(results, scenario.name) / ".submitit"
    locks = sweep_dir(results, scenario.name) / ".locks"
    sweep = dict(scenario=scenario, cluster=cluster, results=results, force=force, no_skip=no_skip,
                 manifest=manifest, sha=sha, echo=echo)
    if cluster.executor == "slurm":
        records, in_flight = _run_on_slurm(specs, folder=folder, locks=locks, no_wait=no_wait, pack=pack, **sweep)
        return SweepResult(records=records, results_dir=sweep_dir(results, scenario.name), wall_s=time.time() - t0,
                           in_flight=in_flight)
    records = []
    # ranks of local CPU cells fork from one warm interpreter instead of importing torch each (harness.launch.local.prefork)
    with prefork.zygote(cluster.env, label=str(sweep_dir(results, scenario.name))) if cluster.device == "cpu" \
            else nullcontext():
        for i, spec in enumerate(specs, 1):
            tag = f"[{i}/{len(specs)}] {spec.run_id}"
            with file_lock(locks / f"{spec.run_id}.lock", blocking=False) as mine:
                if not mine:
                    rec = _record_of_other_sweep(spec, tag=tag, locks=locks, results=results, sweep=scenario.name,
                                                 echo=echo)
                    if rec is not None:
                        records.append(rec)
                        continue
                records.append(_run_cell(spec, tag=tag, folder=folder, **sweep))
    return SweepResult(records=records, results_dir=sweep_dir(results, scenario.name), wall_s=time.time() - t0)


def _record_of_other_sweep(spec: RunSpec, *, tag: str, locks: Path, results: Path, sweep: str,
                           echo: Callable[[str], None]) -> dict | None:
    """Wait until the sweep that holds the cell's lock lets go; its record, or None when it left none."""
    echo(f"{tag}  running in another sweep; waiting for its record")
    with file_lock(locks / f"{spec.run_id}.lock"):
        pass
    try:
        rec = read_record(record_path(results, sweep, spec.run_id))
    except ValueError:
        return None
    echo(f"{tag}  {describe(rec)}  (recorded by the other sweep)")
    return rec


def _prepare_cell(spec: RunSpec, *, tag: str, scenario: Scenario, cluster: Cluster, results: Path, force: bool,
                  no_skip: bool, manifest: Manifest, sha: str | None,
                  echo: Callable[[str], None]) -> tuple[dict | None, dict | None]:
    """(record, None) for a cell that needs no run (an ok record exists, or it is skipped), else (None, payload)."""
    if not force and existing_ok(results, scenario.name, spec.run_id):
        echo(f"{tag}  ok (already recorded; --force reruns)")
        manifest.set(spec.run_id, state="done", status="ok")
        return read_record(record_path(results, scenario.name, spec.run_id)), None
    predicted = predict(spec, cluster)
    reason = spec.unsupported_reason(cluster.device)
    if reason is None and cluster.executor == "slurm":
        from harness.launch.slurm.jobs import unsupported_reason

        reason = unsupported_reason(spec)
    if reason is None and cluster.executor == "local" and cluster.device == "cuda":
        gpus = local_gpus()
        if gpus is not None and spec.world_size > len(gpus):
            env = os.environ.get("CUDA_VISIBLE_DEVICES")
            reason = (f"needs {spec.world_size} GPU{'s' * (spec.world_size != 1)} on this machine; {len(gpus)} "
                      f"visible ({'CUDA_VISIBLE_DEVICES unset' if env is None else f'CUDA_VISIBLE_DEVICES={env!r}'})")
    if reason is None and predicted is not None and predicted.get("fits") is False and not no_skip:
        reason = f"predicted not to fit: {predicted.get('reason')} (--no-skip runs it)"
    if reason is not None:
        rec = skipped_record(spec, sweep=scenario.name, cluster=cluster, results=results, reason=reason,
                             predicted=predicted)
        manifest.set(spec.run_id, state="skipped", status="skipped")
        echo(f"{tag}  skipped: {reason}")
        return rec, None
    return None, make_payload(spec, sweep=scenario.name, cluster=cluster, results=results, sha=sha,
                              predicted=predicted)


def _run_cell(spec: RunSpec, *, tag: str, scenario: Scenario, cluster: Cluster, results: Path, force: bool,
              no_skip: bool, manifest: Manifest, folder: Path, sha: str | None, echo: Callable[[str], None]) -> dict:
    rec, payload = _prepare_cell(spec, tag=tag, scenario=scenario, cluster=cluster, results=results, force=force,
                                 no_skip=no_skip, manifest=manifest, sha=sha, echo=echo)
    if rec is not None:
        return rec
    manifest.set(spec.run_id, state="running", status=None, attempt=payload["attempt"])
    c0 = time.time()
    try:
        rec = launch_submitit(payload, cluster=cluster, folder=folder, time_limit_s=spec.settings.time_limit_s,
                              on_submit=lambda job: manifest.set(spec.run_id, job_id=str(job.job_id)))
    except KeyboardInterrupt:
        manifest.set(spec.run_id, state="cancelled", status="cancelled")
        echo(f"{tag}  cancelled (interrupted; re-run the sweep to resume)")
        raise
    manifest.set(spec.run_id, state="done" if rec["status"] == "ok" else "failed", status=rec["status"])
    echo(f"{tag}  {describe(rec)}  ({time.time() - c0:.1f} s)")
    return rec


def cell_state(rec: dict) -> str:
    """The manifest state of a cell that has its record."""
    return {"ok": "done", "skipped": "skipped", "cancelled": "cancelled"}.get(rec["status"], "failed")


def _run_on_slurm(specs: list[RunSpec], *, scenario: Scenario, results: Path, locks: Path,
                  echo: Callable[[str], None], **sweep: Any) -> tuple[list[dict], int]:
    """(records, cells left in flight): every cell through _slurm_round; a cell another sweep was handling is
    taken from its record, or, when that sweep let go without one (it detached), in a second round."""
    tags = {s.run_id: f"[{i}/{len(specs)}] {s.run_id}" for i, s in enumerate(specs, 1)}
    records: dict[str, dict] = {}
    in_flight = 0
    todo = specs
    for _ in range(2):
        busy, left = _slurm_round(todo, tags=tags, records=records, scenario=scenario, results=results,
                                  locks=locks, echo=echo, **sweep)
        in_flight += left
        todo = []
        for spec in busy:
            rec = _record_of_other_sweep(spec, tag=tags[spec.run_id], locks=locks, results=results,
                                         sweep=scenario.name, echo=echo)
            if rec is None:
                todo.append(spec)
            else:
                records[spec.run_id] = rec
        if not todo:
            break
    for spec in todo:
        echo(f"{tags[spec.run_id]}  left to another sweep (no record yet); re-run to collect it")
    return [records[s.run_id] for s in specs if s.run_id in records], in_flight


def _slurm_round(specs: list[RunSpec], *, tags: dict[str, str], records: dict[str, dict], scenario: Scenario,
                 cluster: Cluster, results: Path, force: bool, no_skip: bool, no_wait: bool, pack: bool,
                 manifest: Manifest, folder: Path, locks: Path, sha: str | None,
                 echo: Callable[[str], None]) -> tuple[list[RunSpec], int]:
    """Re-attach to the jobs an earlier sweep left queued or running, submit every other cell that needs a run
    (job arrays; with `pack`, one job per pack of same-shaped cells), then finalize each as it ends — unless
    `no_wait`. Fills `records`; returns the cells another sweep holds and how many cells were left in flight."""
    from harness.launch.slurm.jobs import SlurmSweep

    busy: list[RunSpec] = []
    with ExitStack() as held:  # each cell's lock, for as long as this sweep is responsible for the cell
        flight = SlurmSweep(cluster, folder=folder, manifest=manifest, echo=echo)
        to_submit = []
        for spec in specs:
            tag = tags[spec.run_id]
            if not held.enter_context(file_lock(locks / f"{spec.run_id}.lock", blocking=False)):
                busy.append(spec)
                continue
            if flight.reattach(spec.run_id, tag=tag):
                continue
            rec, payload = _prepare_cell(spec, tag=tag, scenario=scenario, cluster=cluster, results=results,
                                         force=force, no_skip=no_skip, manifest=manifest, sha=sha, echo=echo)
            if rec is not None:
                records[spec.run_id] = rec
            else:
                to_submit.append((payload, tag))
        try:
            records.update(flight.submit(to_submit, pack=pack))
            if not no_wait:
                records.update(flight.wait())
        except KeyboardInterrupt:
            # NOTE: an interrupted sweep cancels its jobs and records them cancelled, as the local path does (a
            # re-run resubmits them); detaching is what --no-wait is for
            flight.cancel_all(reason="the sweep was interrupted")
            raise
        return busy, flight.detach() if no_wait else 0


def describe(rec: dict) -> str:
    """One line for a terminal: status and the headline numbers."""
    if rec["status"] != "ok":
        reason = (rec.get("reason") or "").splitlines()[0][:160] if rec.get("reason") else ""
        rank = f" (rank {rec['failed_rank']})" if rec.get("failed_rank") is not None else ""
        return f"{rec['status']}{rank}: {reason}"
    m = rec["metrics"]
    parts = [f"ok  {m['step_time_s']['median'] * 1e3:.1f} ms/step", f"{m['tokens_per_s_per_gpu']:.0f} tok/s/gpu",
             f"loss {m['loss']:.4f}"]
    if m.get("mfu") is not None:
        parts.append(f"MFU {m['mfu'] * 100:.1f}%")
    if m.get("peak_memory_allocated_gib") is not None:
        parts.append(f"peak {m['peak_memory_allocated_gib']:.2f} GiB")
    if rec.get("reason"):  # a caveat on these numbers (e.g. a recompilation timed as step time)
        parts.append(f"note: {rec['reason'].splitlines()[0][:160]}")
    return "  ".join(parts)
