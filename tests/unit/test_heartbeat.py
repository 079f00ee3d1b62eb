"""Failures no rank raised, attributed from the ranks' heartbeats (harness.launch.core.outcome.beat_verdict), as NCCL
leaves them: a rank killed while the others block until the watchdog aborts them without an exception, a rank hung
while the watchdog aborts the others; and NCCL's error strings read as consequences of another rank's failure.
The beats are written here as the worker writes them (harness.results.store.write_beat); tests/faults/test_heartbeat.py
freezes a real gloo rank."""

from __future__ import annotations

import pytest

from harness.launch.core.outcome import STALE_S, beat_verdict, beats_of, classify, is_secondary, stopped_ranks
from harness.results.record import Beat, Fragment
from harness.results.store import write_beat

T0 = 1_000_000.0
PG_TIMEOUT_S = 600.0


def beat(rank: int, time: float, *, phase: str = "timed", since: float = T0 + 5, ended: bool = False) -> Beat:
    return Beat(rank=rank, attempt="a1", pid=100 + rank, hostname=f"gpu{rank // 8}", phase=phase, phase_since=since,
                time=time, ended=ended)  # fmt: skip


def verdict(beats, *, now, world_size=None):
    return beat_verdict(beats, world_size=world_size or len(beats), pg_timeout_s=PG_TIMEOUT_S, now=now)


def test_a_rank_killed_while_the_others_block_is_the_crashed_culprit():
    # rank 3 SIGKILLed at T0+20; ranks 0-2, 4-7 blocked in cuda synchronize, beating until the launcher ends them
    now = T0 + 20 + STALE_S + 1
    beats = [beat(r, T0 + 20 if r == 3 else now - 0.5) for r in range(8)]
    assert stopped_ranks(beats, now=now) == [3]
    status, reason, rank = verdict(beats, now=now)
    assert (status, rank) == ("crashed", 3)
    assert reason == (
        "rank 3 stopped without an exception in phase 'timed' (on gpu0, pid 103): its heartbeat ended 10 s before "
        "the other ranks' (heartbeats: died, killed or frozen)"
    )


def test_a_hung_rank_is_named_when_the_watchdog_aborted_the_others():
    # rank 5 hangs in step k at T0+20; the others block in step k's collective and the NCCL watchdog aborts them at
    # T0+20+600 (no exception); rank 5 beats on until the launcher ends the cell
    killed = T0 + 20 + PG_TIMEOUT_S
    now = killed + STALE_S + 1
    beats = [beat(r, now - 0.3 if r == 5 else killed, since=T0 + 19) for r in range(8)]
    status, reason, rank = verdict(beats, now=now)
    assert (status, rank) == ("timeout", 5)
    assert reason.startswith(
        "rank 5 stopped making progress: ranks 0, 1, 2, 3, 4, 6, 7 waited 601 s in phase 'timed' (the 600 s watchdog)"
    )


def test_two_ranks_a_crash_and_a_hang_are_told_apart_by_the_time_in_the_phase():
    now = T0 + 700
    crashed = [beat(0, now - 1), beat(1, T0 + 30)]  # rank 1 stopped 25 s into the phase
    assert verdict(crashed, now=now)[::2] == ("crashed", 1)
    hung = [beat(0, now - 1), beat(1, T0 + 5 + PG_TIMEOUT_S + 2)]  # rank 1 stopped after the watchdog's 600 s
    assert verdict(hung, now=now)[::2] == ("timeout", 0)


@pytest.mark.parametrize(
    "beats",
    [
        [beat(0, T0 + 99.5), beat(1, T0 + 99.8)],  # every rank still beats
        [beat(0, T0 + 50, ended=True), beat(1, T0 + 50, ended=True)],  # both left the benchmark
        [beat(0, T0 + 50), beat(1, T0 + 51)],  # both stopped together (killed at once): nothing tells them apart
    ],
    ids=["alive", "ended", "together"],
)
def test_beats_that_tell_nothing_leave_the_verdict_to_the_other_evidence(beats):
    assert verdict(beats, now=T0 + 100) is None


def test_classify_uses_the_beats_only_when_no_rank_left_a_fragment():
    now = T0 + 60
    beats = [beat(0, now - 1), beat(1, T0 + 30)]
    args = dict(world_size=2, elapsed_s=50.0, time_limit_s=900.0, cancelled=False, exit_codes=[-9, -15],
                pg_timeout_s=PG_TIMEOUT_S, beats=beats, now=now)  # fmt: skip
    # before: "the ranks exited without a record or an exception (exit codes [-9, -15])", no culprit
    assert classify([], **args)[::2] == ("crashed", 1)
    # a rank's own exception still decides
    frag = Fragment(rank=0, attempt="a1", status="error", reason="RuntimeError: injected", time=T0 + 29)
    assert classify([frag], **args) == ("error", "RuntimeError: injected", 0)


def test_the_beats_are_read_back_per_rank_for_this_attempt(tmp_path):
    from harness.core.zoo import ZOO
    from harness.results.payload import Payload
    from harness.scenario.spec import RunSpec, Settings

    spec = RunSpec("tiny", ZOO["tiny"], "ddp", "fp32", gpus=2, nodes=1, gpus_per_node=2, settings=Settings())
    payload = Payload.model_validate(
        {"spec": spec, "run_id": "r1",
         "sweep": "s", "results": str(tmp_path), "attempt": "a1",
         "cluster": {"name": "local", "device": "cpu", "pg_timeout_s": 60, "env": {}},
         "git_sha": None, "predicted": None, "master_port": None}
    )  # fmt: skip
    write_beat(tmp_path, "s", "r1", beat(1, T0 + 2))
    write_beat(tmp_path, "s", "r1", beat(0, T0 + 1))
    write_beat(tmp_path, "s", "r1", beat(0, T0 + 3).model_copy(update={"rank": 2, "attempt": "old"}))
    assert [(b.rank, b.time) for b in beats_of(payload)] == [(0, T0 + 1), (1, T0 + 2)]


@pytest.mark.parametrize(
    "reason",
    [
        "DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, remote process exited or there was a network "
        "error, NCCL version 2.27.3\nncclRemoteError: A call failed possibly due to a network error or a remote "
        "process exiting prematurely.",
        "RuntimeError: Some NCCL operations have failed or timed out. Due to the asynchronous nature of CUDA kernels",
        "DistNetworkError: failed to recv, got 0 bytes",
    ],
)
def test_nccls_words_for_a_lost_peer_are_secondary(reason):
    assert is_secondary(Fragment(rank=0, status="error", reason=reason, time=T0))


def test_a_ranks_own_cuda_error_is_not_secondary():
    assert not is_secondary(Fragment(rank=0, status="error", reason="CUDA error: an illegal memory access", time=T0))
