#!/usr/bin/env bash
# One prepared GPU check (issue 23, item 5; issue 37): <= 9.5 minutes on one H200, one JSON object on stdout.
#
#   bash bench/device_check.sh                      # on the GPU machine
#   DEVICE=cpu bash bench/device_check.sh --dry     # every part in a tiny mode on CPU (a dry check)
#
# Parts, each under its own timeout so a slow one cannot eat the others' time:
#   trainer   bench/trainer.py --size gpu --master-fp32  (dense + MoE probe, GSPO vs naive tokens/s;
#             targets: >= 1.2x naive, dense and MoE), then the SmolLM2 row; naive and GSPO interleaved
#   shared    bench/trainer.py --rows shared             (SmolLM2, harness-shaped groups: a 6k / 20k shared
#             prompt, 8 / 16 branches of 0.5-2k tokens, the group in one micro-batch (a shape whose packed
#             step does not fit is an error row); packed vs shared_prefix Trainer.steps interleaved,
#             3 rounds: tokens computed, step time median [min, max], peak memory)
#   mismatch  bench/mismatch.py --size gpu             (bf16 MoE rollout/trainer Pearson >= 0.999)
#   smollm2   bench/smollm2_steps.py                   (examples/smollm2-calc.toml on the device, 3 steps)
# A part that fails or times out is reported as {"rc": N, "tail": "..."}; the others still run.
set -u
cd "$(dirname "$0")/.."
DEVICE="${DEVICE:-cuda}"
PY="${PYTHON:-python}"
DRY=0
[ "${1:-}" = "--dry" ] && DRY=1
OUT_DIR="$(mktemp -d)"
trap 'rm -rf "$OUT_DIR"' EXIT
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

if [ "$DRY" = 1 ]; then
  TRAINER=(bench/trainer.py --device "$DEVICE" --size cpu --only probe-dense --steps 1 --warm 0)
  TRAINER2=(bench/trainer.py --device "$DEVICE" --size cpu --only smollm2-135m-instruct --B 2 --T 32 --steps 1 --warm 0)
  MISMATCH=(bench/mismatch.py --device "$DEVICE" --size cpu --kinds dense --dtypes float32 --bpt 1,8,4 --skip-probe)
  SMOL=(bench/smollm2_steps.py --device "$DEVICE" --steps 1 --tiny)
  SHARED=(bench/trainer.py --device "$DEVICE" --rows shared --only smollm2-135m-instruct --shapes 200x2 --branch 40,60 --rounds 1 --warm 0)
  T_TRAIN=300 T_TRAIN2=300 T_MISMATCH=300 T_SMOL=300 T_SHARED=300
else
  TRAINER=(bench/trainer.py --device "$DEVICE" --size gpu --master-fp32)
  TRAINER2=(bench/trainer.py --device "$DEVICE" --size gpu --master-fp32 --only smollm2-135m-instruct)
  MISMATCH=(bench/mismatch.py --device "$DEVICE" --size gpu --dtypes bfloat16)
  SMOL=(bench/smollm2_steps.py --device "$DEVICE" --steps 3)
  SHARED=(bench/trainer.py --device "$DEVICE" --rows shared --only smollm2-135m-instruct --shapes 6000x8,6000x16,20000x8 --rounds 3 --warm 1)
  T_TRAIN=120 T_TRAIN2=60 T_MISMATCH=120 T_SMOL=150 T_SHARED=120
fi

part() {  # name timeout_s command...: its stdout's last line (a JSON object) into $OUT_DIR/name.json
  local name=$1 limit=$2
  shift 2
  timeout "$limit" "$PY" "$@" >"$OUT_DIR/$name.out" 2>"$OUT_DIR/$name.err"
  echo $? >"$OUT_DIR/$name.rc"
}

part trainer "$T_TRAIN" "${TRAINER[@]}"
part trainer_smollm2 "$T_TRAIN2" "${TRAINER2[@]}"
part mismatch "$T_MISMATCH" "${MISMATCH[@]}"
part smollm2 "$T_SMOL" "${SMOL[@]}"
part shared "$T_SHARED" "${SHARED[@]}"

"$PY" - "$OUT_DIR" "$DEVICE" "$DRY" <<'EOF'
import json, sys
from pathlib import Path

out, device, dry = Path(sys.argv[1]), sys.argv[2], sys.argv[3] == "1"
result = {"device": device, "dry": dry, "parts": {}}
for name in ("trainer", "trainer_smollm2", "mismatch", "smollm2", "shared"):
    rc = int((out / f"{name}.rc").read_text())
    lines = [ln for ln in (out / f"{name}.out").read_text().splitlines() if ln.startswith("{")]
    if rc == 0 and lines:
        result["parts"][name] = json.loads(lines[-1])
    else:
        result["parts"][name] = {"rc": rc, "tail": (out / f"{name}.err").read_text()[-1500:]}
try:
    import torch
    if torch.cuda.is_available():
        result["gpu"] = torch.cuda.get_device_name()
except Exception:
    pass
rows = result["parts"]["trainer"].get("rows", []) + result["parts"]["trainer_smollm2"].get("rows", [])
result["speedup_vs_naive"] = {r["kind"]: r["speedup_vs_naive"] for r in rows if "speedup_vs_naive" in r}
result["shared_prefix"] = {
    f'{r["prefix"]}x{r["branches"]}': {"fewer_tokens": r["fewer_tokens"], "speedup": r["speedup"]}
    for r in result["parts"]["shared"].get("rows", [])
    if "speedup" in r
}
print(json.dumps(result))
sys.exit(0 if all("rc" not in p for p in result["parts"].values()) else 1)
EOF
