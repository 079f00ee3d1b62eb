#!/usr/bin/env bash
# The prepared device checks (H200, world 1), in parts that each fit one device call (budget: 15 min in all):
#   small  125m every strategy x checkpointing policy (planner: predicted vs measured peak), a real CUDA OOM
#          then an ok cell                                                              (~4 min)
#   large  1.3b ddp/fsdp/zero1/zero3 x checkpointing, 7b ZeRO-3 (step time, TFLOPS, MFU, memory) (~6 min)
#   bench  harness step vs bare loop, 125m and 1.3b, each family with and without compile, TFLOPS, MFU;
#          the comm meter's per-collective cost                                          (~5 min)
# Everything lands in $OUT. Device run: bash bench/gpu_check.sh small   (carry .whl: deepspeed, submitit,
# hjson, pydantic, ... wheels; see the device README)
set -uo pipefail
PART=${1:-small}
OUT=${OUT:-/tmp/gpu-check}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:${PYTHONPATH:-}
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site:$PYTHONPATH
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
if [ "$PART" = bench ]; then
  for model in 125m 1.3b; do
    timeout 280 python3 bench/bench_step_overhead.py --device cuda --model $model --micro-batch 8 --seq-len 2048 \
      --precision bf16 --strategy ddp fsdp.full_shard fsdp2.full_shard zero3 --compile both --rounds 4 --steps 3 \
      2>&1 | grep -v WARNING | tee "$OUT/step_overhead_$model.txt"
  done
  timeout 60 python3 bench/bench_comm_meter.py --device cuda 2>&1 | grep -v WARNING | tail -15 | tee "$OUT/comm_meter.txt"
  exit 0
fi
SCEN=scenarios/gpu-check.yaml; [ "$PART" = small ] && SCEN=scenarios/gpu-check-small.yaml
python3 -m harness.cli sweep $SCEN --cluster local-gpu --results "$OUT/results" --no-skip \
  2>&1 | tee "$OUT/sweep_$PART.log" | grep -E '^\[|done in|records'
python3 - "$OUT/results" <<'PY' | tee "$OUT/table_$PART.md"
import sys
from harness.results import load_records
ac = lambda r: r["spec"]["activation_checkpointing"]
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
