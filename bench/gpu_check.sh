#!/usr/bin/env bash
# The prepared device checks (H200, world 1), in parts that each fit one device call (budget: 15 min in all):
# Each sweep part ends with the plan's recommendation (the device's shipped profile) beside the measured fastest
# and, per ok cell, measured tensor memory by category beside the plan's (bench/gpu_check_memory.py).
#   small  125m every strategy x checkpointing policy (planner: predicted vs measured peak), a real CUDA OOM
#          then an ok cell, one traced cell (the breakdown from device kernels, the profiler's cost), one FSDP2 cell
#          with wrap_blocks 2 and reshard_after_forward false (the grouped fully_shard on CUDA streams)
#   large  1.3b ddp/fsdp/zero1/zero3 x checkpointing, 7b ZeRO-3 (step time, TFLOPS, MFU, memory)
#   bench  the comm meter's cost (1.3b); harness step vs bare loop, 1.3b compiled, 1.3b eager, then 125m, each
#          family, TFLOPS, MFU
# Several parts may share one call (`gpu_check.sh large bench`), in the order given. Everything ends by DEADLINE
# seconds (default 560; the device call's limit is 600): every command gets what is left, most valuable first;
# a sweep cut short is interrupted (SIGINT) so its cells left are recorded `cancelled` and its table is still
# written; a part reached with under a minute left says so and is skipped. In $OUT (a call returns at most 8
# files): gpu.txt, table_<part>.md and records_<part>.tgz (records and sweep log) per sweep part, bench.txt.
# Device run: bash bench/gpu_check.sh large, carrying .whl (DeepSpeed, submitit, pydantic, hjson, ... as cp312
# wheels; build it here first with `bash bench/device_wheels.sh`)
# CPU dry mode (GPU_CHECK_DRY=1; CI runs it): the same parts through the same commands, on CPU with the tiny model
# (bench/gpu_check_dry.py shrinks each scenario; cluster `local`; the benches at --device cpu, tiny, few rounds,
# compile off), so the script and what it calls are known to run the day a GPU is there. PYTHON picks the
# interpreter (default python3; CI: .venv/bin/python).
set -uo pipefail
DRY=${GPU_CHECK_DRY:-}
PY=${PYTHON:-python3}
PARTS=("${@:-small}")
for part in "${PARTS[@]}"; do
  case $part in small|large|bench) ;; *) echo "unknown part '$part' (small | large | bench)" >&2; exit 2 ;; esac
done
OUT=${OUT:-/tmp/gpu-check}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:${PYTHONPATH:-}
if [ -d .whl ] && [ -z "$DRY" ]; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site:$PYTHONPATH
fi
if [ -n "$DRY" ]; then
  "$PY" -c "import torch; print(f'dry mode: cpu, torch {torch.__version__}, no GPU')" | tee "$OUT/gpu.txt"
  CLUSTER=local PROFILE=h100
else
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
  CLUSTER=local-gpu
  # the shipped profile of this device, for the plan's recommendation beside the measurements (none: not printed)
  case $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1) in
    *H200*) PROFILE=h200 ;; *H100*) PROFILE=h100 ;; *A100*80GB*) PROFILE=a100 ;; *A100*) PROFILE=a100-40gb ;; *) PROFILE= ;;
  esac
fi
DEADLINE=${DEADLINE:-560}
FAILED=()
dry_rc() {  # dry mode: a command that failed fails the check (on a GPU the table and logs say what happened)
  if [ -n "$DRY" ] && [ "$2" != 0 ]; then FAILED+=("$1 (exit $2)"); fi
}
left() { local l=$((DEADLINE - SECONDS)); echo $((l > 10 ? l : 10)); }   # seconds left (at least 10)
cap() { local l; l=$(left); echo $(($1 < l ? $1 : l)); }                  # min(cap, seconds left)

bench_part() {
  if [ -n "$DRY" ]; then  # the same two benches, tiny on CPU, compile off (inductor's CPU build takes minutes)
    timeout "$(cap 60)" "$PY" bench/bench_comm_meter.py --device cpu --world 1 --model tiny --precision bf16 \
      --micro-batch 2 --seq-len 64 --rounds 1 --warmup 2 --strategy ddp 2>&1 | grep -v WARNING | tee -a "$OUT/bench.txt"
    dry_rc "bench_comm_meter" "${PIPESTATUS[0]}"
    timeout "$(cap 60)" "$PY" bench/bench_step_overhead.py --device cpu --model tiny --micro-batch 2 --seq-len 64 \
      --precision bf16 --strategy ddp zero3 --compile off --rounds 1 --steps 1 2>&1 \
      | grep -v WARNING | tee -a "$OUT/bench.txt"
    dry_rc "bench_step_overhead" "${PIPESTATUS[0]}"
    return
  fi
  timeout "$(cap 150)" "$PY" bench/bench_comm_meter.py --device cuda --world 1 --model 1.3b --precision bf16 \
    --micro-batch 4 --seq-len 2048 --rounds 40 2>&1 | grep -v WARNING | tee -a "$OUT/bench.txt"
  overhead() {  # model compile seconds-cap
    timeout "$(cap "$3")" "$PY" bench/bench_step_overhead.py --device cuda --model "$1" --micro-batch 8 \
      --seq-len 2048 --precision bf16 --strategy ddp fsdp.full_shard fsdp2.full_shard zero3 --compile "$2" \
      --rounds 4 --steps 3 2>&1 | grep -v WARNING | tee -a "$OUT/bench.txt"
  }
  overhead 1.3b on 220
  overhead 1.3b off 120
  overhead 125m both 200
}

sweep_part() {
  local part=$1 scen=scenarios/gpu-check.yaml results=/tmp/gpu-check-results/$1
  [ "$part" = small ] && scen=scenarios/gpu-check-small.yaml
  if [ -n "$DRY" ]; then results=$OUT/dry-results; scen=$("$PY" bench/gpu_check_dry.py "$scen" "$OUT/dry-$part.yaml"); fi
  mkdir -p "$results"
  timeout -s INT -k 20 "$(($(left) - 25))" "$PY" -m harness.cli sweep "$scen" --cluster "$CLUSTER" \
    --results "$results" --no-skip 2>&1 | tee "$results.log" | grep -E '^\[|done in|records|nterrupt'
  dry_rc "sweep $part" "${PIPESTATUS[0]}"
  "$PY" - "$results" <<'PY' | tee "$OUT/table_$part.md"
import sys
from harness.results.store import load_records
ac = lambda r: r["spec"]["activation_checkpointing"]
records, warns = load_records(sys.argv[1])
recs = [rec.to_dict() for rec in records]  # each record as its file has it
print("| cell | status | step s (p50) | TFLOPS/GPU | MFU | peak alloc GiB | predicted GiB | pred/meas |")
print("|---|---|---|---|---|---|---|---|")
for r in sorted(recs, key=lambda r: r["run_id"]):
    m, p = r.get("metrics") or {}, ((r.get("predicted") or {}).get("memory_gib") or {})
    st = (m.get("step_time_s") or {}).get("median")
    alloc, pred = m.get("peak_memory_allocated_gib"), p.get("total")
    f = lambda v, k="{:.3f}": "n/a" if v is None else k.format(v)
    ratio = f(pred / alloc if pred and alloc else None)
    print(f"| {r['run_id'][:-11]}{'' if ac(r) == 'none' else ' ac=' + ac(r)}{' traced' if r['spec'].get('trace') else ''} | {r['status']} "
          f"{(r.get('reason') or '')[:60]} | {f(st)} | {f(m.get('tflops_per_gpu'), '{:.1f}')} | "
          f"{f(m.get('mfu'), '{:.3f}')} | {f(alloc, '{:.2f}')} | {f(pred, '{:.2f}')} | {ratio} |")
traced = [r for r in recs if ((r.get("metrics") or {}).get("time_s") or {}).get("step") is not None]
if traced:  # trace: true cells (issue 33): the breakdown read from the device timeline, the profiler's cost
    parts = ("compute", "recompute", "optimizer", "comm_exposed", "other", "comm_total")
    print("\n| traced cell | traced step s | " + " | ".join(f"{p} s" for p in parts) + " | basis | traced/untraced |")
    print("|---" * (len(parts) + 4) + "|")
    for r in traced:
        t = r["metrics"]["time_s"]
        g = lambda v: "n/a" if v is None else f"{v:.4f}"
        print(f"| {r['run_id'][:-11]} ac={ac(r)} | {g(t.get('step'))} | " + " | ".join(g(t.get(p)) for p in parts)
              + f" | {t.get('basis')} | {g(t.get('profiler_cost'))} |")
print("warnings:", warns)
PY
  # measured tensor memory beside the plan's, per category, and the allocator's fragmentation (issue 54)
  "$PY" bench/gpu_check_memory.py "$results" 2>&1 | tee -a "$OUT/table_$part.md"
  dry_rc "memory $part" "${PIPESTATUS[0]}"
  if [ -n "$PROFILE" ]; then  # the plan's recommended cell beside the measured fastest (issue 52)
    "$PY" bench/gpu_check_recommend.py "$scen" "$PROFILE" "$results" 2>&1 | tee -a "$OUT/table_$part.md"
    dry_rc "recommend $part" "${PIPESTATUS[0]}"
  fi
  cp "$results.log" "$results/"
  tar czf "$OUT/records_$part.tgz" -C "$results" .
}

for part in "${PARTS[@]}"; do
  if [ $((DEADLINE - SECONDS)) -lt 60 ]; then
    echo "part $part skipped: $((DEADLINE - SECONDS)) s left of DEADLINE=$DEADLINE" | tee -a "$OUT/gpu.txt"
    continue
  fi
  echo "== part $part ($((DEADLINE - SECONDS)) s left)"
  if [ "$part" = bench ]; then bench_part; else sweep_part "$part"; fi
done
if [ -n "$DRY" ]; then
  if [ ${#FAILED[@]} -gt 0 ]; then echo "gpu_check dry mode FAILED: ${FAILED[*]}" >&2; exit 1; fi
  echo "gpu_check dry mode: every part ran (${PARTS[*]})"
fi
