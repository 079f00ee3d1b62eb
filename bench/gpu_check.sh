#!/usr/bin/env bash
# One prepared device check (H200, world 1): the foundation's records (step time, TFLOPS, MFU, peak memory),
# the planner's predicted-vs-measured memory, a real CUDA OOM followed by an ok cell, the step-overhead
# ratio and the comm-meter overhead. Sized for about 8 minutes on an H200; everything lands in $OUT.
#   device run: bash bench/gpu_check.sh   (carry .whl with deepspeed, submitit, hjson, ... wheels)
set -uo pipefail
OUT=${OUT:-/tmp/gpu-check}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:${PYTHONPATH:-}
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site:$PYTHONPATH
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
python3 -m harness.cli sweep scenarios/gpu-check.yaml --cluster local-gpu --results "$OUT/results" --no-skip \
  2>&1 | tee "$OUT/sweep.log" | grep -E '^\[|done in|records'
python3 - "$OUT/results" <<'PY' | tee "$OUT/table.md"
import sys
from harness.results import load_records
from harness.scenario import canonical_setting
ac = lambda r: canonical_setting("activation_checkpointing", r["spec"]["activation_checkpointing"])
recs, warns = load_records(sys.argv[1])
print("| cell | status | step s (p50) | TFLOPS/GPU | MFU | peak alloc GiB | predicted GiB | pred/meas |")
print("|---|---|---|---|---|---|---|---|")
for r in sorted(recs, key=lambda r: r["run_id"]):
    m, p = r.get("metrics") or {}, ((r.get("predicted") or {}).get("memory_gib") or {})
    st = (m.get("step_time_s") or {}).get("median")
    alloc, pred = m.get("peak_memory_allocated_gib"), p.get("total")
    f = lambda v, k="{:.3f}": "n/a" if v is None else k.format(v)
    ratio = f(pred / alloc if pred and alloc else None)
    print(f"| {r['run_id'][:-11]}{'' if ac(r) == 'none' else ' ac=' + ac(r)} | {r['status']} "
          f"{(r.get('reason') or '')[:60]} | {f(st)} | {f(m.get('tflops_per_gpu'), '{:.1f}')} | "
          f"{f(m.get('mfu'), '{:.3f}')} | {f(alloc, '{:.2f}')} | {f(pred, '{:.2f}')} | {ratio} |")
print("warnings:", warns)
PY
timeout 150 python3 bench/bench_step_overhead.py --device cuda --model 1.3b --micro-batch 8 --seq-len 2048 \
  --precision bf16 --strategy ddp zero3 --rounds 4 --steps 3 2>&1 | grep -v WARNING | tee "$OUT/step_overhead.txt"
timeout 120 python3 bench/bench_comm_meter.py --device cuda 2>&1 | grep -v WARNING | tail -15 | tee "$OUT/comm_meter.txt"
