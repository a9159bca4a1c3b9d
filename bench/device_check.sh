#!/usr/bin/env bash
# One prepared GPU check (issue 23, item 5): <= 8 minutes on one H200, one JSON object on stdout.
#
#   bash bench/device_check.sh                      # on the GPU machine
#   DEVICE=cpu bash bench/device_check.sh --dry     # every part in a tiny mode on CPU (a dry check)
#
# Parts, each under its own timeout so a slow one cannot eat the others' time:
#   trainer   bench/trainer.py --size gpu --master-fp32  (dense + MoE probe, GSPO vs naive tokens/s;
#             targets: >= 1.2x naive, dense and MoE), then the SmolLM2 row
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
  T_TRAIN=300 T_TRAIN2=300 T_MISMATCH=300 T_SMOL=300
else
  TRAINER=(bench/trainer.py --device "$DEVICE" --size gpu --master-fp32)
  TRAINER2=(bench/trainer.py --device "$DEVICE" --size gpu --master-fp32 --only smollm2-135m-instruct)
  MISMATCH=(bench/mismatch.py --device "$DEVICE" --size gpu --dtypes bfloat16)
  SMOL=(bench/smollm2_steps.py --device "$DEVICE" --steps 3)
  T_TRAIN=120 T_TRAIN2=60 T_MISMATCH=120 T_SMOL=150
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

"$PY" - "$OUT_DIR" "$DEVICE" "$DRY" <<'EOF'
import json, sys
from pathlib import Path

out, device, dry = Path(sys.argv[1]), sys.argv[2], sys.argv[3] == "1"
result = {"device": device, "dry": dry, "parts": {}}
for name in ("trainer", "trainer_smollm2", "mismatch", "smollm2"):
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
print(json.dumps(result))
sys.exit(0 if all("rc" not in p for p in result["parts"].values()) else 1)
EOF
