"""How a cell that ended becomes its one record (harness.launch.core.outcome): `classify` for every status it can
give a cell without rank 0's record — the first failing rank as the root cause, the silent rank behind the others'
broken collectives — and `finalize`, which keeps rank 0's own record (ok, nan) when this attempt wrote one.

Pure: fragments are the dicts the worker writes (harness.worker.runner.write_fragment), no process is started.
"""

from __future__ import annotations

import json

import pytest

from harness.launch.core.outcome import classify, finalize, is_secondary
from harness.launch.core.payload import make_payload
from harness.results.payload import Payload
from harness.results.record import Fragment, Record
from harness.results.store import fragment_dir, new_record, read_record, record_path, write_record
from harness.scenario.cluster import load_cluster
from tests.conftest import make_spec

# what the ranks' exceptions say, as the worker records them (f"{type(e).__name__}: {e}")
GLOO_CLOSED = (
    "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [10.0.0.2]:4711"
)
GLOO_TIMEOUT = (
    "RuntimeError: [../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting "
    "30000ms for recv operation to complete"
)
INJECTED = "RuntimeError: injected exception (rank 1, step 2)"
CUDA_OOM = "OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"


def frag(rank: int, status: str, reason: str, time: float, *, attempt: str = "a1") -> Fragment:
    return Fragment(rank=rank, attempt=attempt, status=status, reason=reason, time=time, hostname="node1")


def outcome(
    frags: list[Fragment],
    *,
    world_size: int = 2,
    elapsed_s: float = 5.0,
    time_limit_s: float = 60.0,
    cancelled: bool = False,
    exit_codes: list | None = None,
    ended: tuple[str, str] | None = None,
    job_errors: dict[int, str] | None = None,
) -> tuple[str, str, int | None]:
    return classify(
        frags,
        world_size=world_size,
        elapsed_s=elapsed_s,
        time_limit_s=time_limit_s,
        cancelled=cancelled,
        exit_codes=exit_codes,
        pg_timeout_s=30.0,
        ended=ended,
        job_errors=job_errors,
    )


# ---- the statuses a rank reports itself: the first rank to fail is the cause


def test_a_ranks_exception_is_an_error_of_that_rank():
    assert outcome([frag(1, "error", INJECTED, 10.0)]) == ("error", INJECTED, 1)


def test_a_ranks_oom_is_an_oom_of_that_rank():
    assert outcome([frag(0, "oom", CUDA_OOM, 10.0)]) == ("oom", CUDA_OOM, 0)


def test_a_ranks_slurm_time_limit_is_a_timeout_of_that_rank():
    # submitit's USR2 handler raising in rank 0 at the job's time limit (the worker's _is_slurm_time_limit)
    reason = "UncompletedJobError: Job not requeued because: timed-out too many times."
    assert outcome([frag(0, "timeout", reason, 10.0), frag(1, "error", GLOO_CLOSED, 11.0)]) == ("timeout", reason, 0)


def test_the_earliest_primary_failure_wins_over_later_ones_and_over_broken_collectives():
    frags = [
        frag(0, "error", GLOO_CLOSED, 9.0),  # first in time, but only a consequence
        frag(2, "oom", CUDA_OOM, 11.0),
        frag(1, "error", INJECTED, 10.0),
    ]
    assert outcome(frags, world_size=3) == ("error", INJECTED, 1)


# ---- no rank reports a failure of its own: the ranks that said nothing are the culprits


def test_a_rank_that_died_silently_is_crashed_and_named():
    status, reason, rank = outcome([frag(0, "error", GLOO_CLOSED, 10.0)])
    assert (status, rank) == ("crashed", 1)
    assert reason == (
        f"rank 1 died without raising an exception; the others saw its connection close (rank 0: {GLOO_CLOSED})"
    )


def test_a_rank_that_hung_is_a_watchdog_timeout_and_named():
    status, reason, rank = outcome(
        [frag(0, "error", GLOO_TIMEOUT, 40.0), frag(2, "error", GLOO_CLOSED, 41.0)], world_size=4
    )
    assert (status, rank) == ("timeout", 1)  # ranks 1 and 3 are silent; the first of them is the failed rank
    assert reason == (
        "collective timed out after the 30 s watchdog: rank 1, 3 stopped making progress (rank 0 "
        f"reported: {GLOO_TIMEOUT})"
    )


def test_secondary_failures_on_every_rank_blame_the_first_to_report():
    status, reason, rank = outcome([frag(1, "error", GLOO_CLOSED, 12.0), frag(0, "error", GLOO_CLOSED, 10.0)])
    assert (status, rank) == ("crashed", 0)
    assert reason == (
        f"rank 0 died without raising an exception; the others saw its connection close (rank 0: {GLOO_CLOSED})"
    )


@pytest.mark.parametrize(
    "reason,secondary",
    [
        (GLOO_CLOSED, True),
        (GLOO_TIMEOUT, True),
        ("RuntimeError: NCCL communicator was aborted on rank 1", True),
        ("DistBackendError: [Rank 0] Watchdog caught collective operation timeout", True),
        (INJECTED, False),
        (CUDA_OOM, False),
    ],
)
def test_which_failures_are_secondary(reason, secondary):
    assert is_secondary(frag(0, "error", reason, 1.0)) is secondary


# ---- nothing from the ranks: what the launcher or the scheduler knows


def test_a_cancelled_cell_is_cancelled_whatever_the_ranks_said():
    assert outcome([frag(1, "error", INJECTED, 10.0)], cancelled=True) == (
        "cancelled",
        "the job was cancelled before the cell finished",
        None,
    )


def test_the_schedulers_verdict_is_taken_as_it_is():
    ended = ("timeout", "the cell exceeded its SLURM time limit of 2 min (job 7 TIMEOUT: SLURM killed the ranks)")
    assert outcome([frag(1, "error", GLOO_CLOSED, 10.0)], ended=ended) == (*ended, None)


def test_a_task_error_outside_the_benchmark_is_an_error_with_its_last_line():
    tb = (
        'Traceback (most recent call last):\n  File "x.py", line 1, in <module>\n    import nope\n'
        "ModuleNotFoundError: No module named 'nope'\n"
    )
    assert outcome([], job_errors={1: tb, 0: tb}) == (
        "error",
        "ModuleNotFoundError: No module named 'nope' (rank 0, outside the benchmark)",
        0,
    )


def test_ranks_still_running_at_the_time_limit_are_a_timeout():
    assert outcome([], elapsed_s=60.0, exit_codes=[-15, -15]) == (
        "timeout",
        "the cell exceeded its time limit of 60 s",
        None,
    )


def test_ranks_that_exit_without_a_record_or_an_exception_are_crashed():
    assert outcome([], exit_codes=[-9, 0]) == (
        "crashed",
        "the ranks exited without a record or an exception (exit codes [-9, 0])",
        None,
    )
    assert outcome([]) == ("crashed", "the ranks exited without a record or an exception", None)


# ---- finalize: rank 0's record when this attempt wrote one (ok, nan), else the composed one


@pytest.fixture
def payload(tmp_path) -> Payload:
    spec = make_spec(strategy="ddp")
    return make_payload(spec, sweep="s", cluster=load_cluster("local"), results=tmp_path, sha="abc", predicted=None)


def rank0_record(payload: Payload, status: str, **fields) -> Record:
    rec = new_record(
        spec=payload.spec,
        run_id=payload.run_id,
        sweep=payload.sweep,
        cluster=payload.cluster.name,
        status=status,
        attempt=payload.attempt,
        **fields,
    )
    write_record(payload.results, rec)
    return read_record(record_path(payload.results, payload.sweep, payload.run_id))


@pytest.mark.parametrize(
    "status,fields",
    [
        ("ok", {}),
        ("nan", {"reason": "loss is not finite at step 3 (measured), first on rank 1", "failed_rank": 1}),
    ],
)
def test_rank_0s_record_of_this_attempt_is_the_cells_record(payload, status, fields):
    written = rank0_record(payload, status, **fields)
    write_fragment_file(payload, frag(1, "error", INJECTED, 10.0, attempt=payload.attempt))
    rec = finalize(payload, elapsed_s=100.0, time_limit_s=60.0)
    assert rec.to_dict() == written.to_dict() and rec.status == status


def write_fragment_file(payload: Payload, fragment: Fragment) -> None:
    d = fragment_dir(payload.results, payload.sweep, payload.run_id)
    d.mkdir(parents=True, exist_ok=True)
    (d / f"rank{fragment.rank}.json").write_text(json.dumps(fragment.to_dict()))


def test_without_rank_0s_record_finalize_composes_one_from_this_attempts_fragments(payload):
    earlier = payload.model_copy(update={"attempt": "an earlier attempt"})
    rank0_record(earlier, "ok")  # an earlier attempt's record is not this one's
    write_fragment_file(payload, frag(0, "error", GLOO_CLOSED, 11.0, attempt=payload.attempt))
    write_fragment_file(payload, frag(1, "oom", CUDA_OOM, 10.0, attempt="an earlier attempt"))
    rec = finalize(payload, elapsed_s=5.0, time_limit_s=60.0, exit_codes=[1, -9])
    # rank 1's oom belongs to another attempt: this attempt's rank 1 said nothing
    assert (rec.status, rec.failed_rank) == ("crashed", 1)
    assert rec.reason is not None and rec.reason.startswith("rank 1 died without raising an exception")
    assert [f.rank for f in rec.failures or []] == [0]
    assert rec.attempt == payload.attempt and rec.env.harness_git_sha == "abc"
    assert read_record(record_path(payload.results, "s", payload.run_id)).to_dict() == rec.to_dict()


def test_a_peer_that_saw_the_killed_rank_close_at_the_time_limit_is_the_kills_consequence():
    """A hung cell ended by its launcher at the time limit: rank 0 may still see rank 1's connection close and say so
    before it is killed too (a race with the kill: once in three CI runs of tests/slurm/test_pack.py). The cell timed
    out; it did not crash."""
    closed = frag(0, "error", "RuntimeError: [pair.cc:553] Connection closed by peer [127.0.0.1]:58497", 30.1)
    assert outcome([closed], elapsed_s=30.4, time_limit_s=30.0) == (
        "timeout",
        "the cell exceeded its time limit of 30 s",
        None,
    )
    # before the limit the same fragment still names the silent rank as the one that died
    status, reason, rank = outcome([closed], elapsed_s=12.0, time_limit_s=30.0)
    assert (status, rank) == ("crashed", 1) and reason.startswith("rank 1 died without raising an exception")
