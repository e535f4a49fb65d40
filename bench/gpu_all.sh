#!/usr/bin/env bash
# Every GPU check of the exporters in one run on the device machine, inside 8 minutes:
#   bench/gpu_kernels_check.py  the CUPTI kernel probe: records vs CUPTI's own walk, mixed
#                               record kinds, decode cost, duty cycle, CUPTI-vs-host clock
#   bench/gpu_overhead.py       step-time overhead, all probes on vs off, ABBA rounds, on three
#                               workloads (launch-heavy MLP, GEMM-heavy MLP, small GPT)
#   bench/gpu_collectives.py    every collective timed on its stream (NCCL, CUDA events): phases
#                               recorded, forward its own work, CPU per collective
# Target: H200 with torch 2.11 (no native CUPTI callbacks: the Argus C shim is built here with
# gcc), CUDA 13, CUPTI 13.0.85 (nvidia-cuda-cupti), Python 3.12; nothing can be downloaded there.
#
# Wheels it needs in .whl/ (git-ignored, carried with the working tree), fetched beforehand with
#   echo /.whl/ >> .git/info/exclude
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#     --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
#     --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl \
#     cupti-python==13.0.1 orjson py-spy
#   cupti-python==13.0.1  cp312 x86_64: kernel record dtypes (matches CUPTI 13.0.85)   needed
#   orjson                cp312 x86_64: the exporters' record encoder (file sink)      needed
#   py-spy                x86_64: the stack probe in the all-on overhead mode         optional
# (cupti-python's own needs, cuda-bindings~=13.0, nvidia-cuda-cupti~=13.0 and numpy, are there.)
#
# Run it with the device tool: carry [".whl"], command "bash bench/gpu_all.sh", timeout_s 540.
# Writes under $OUT (./gpu-out when OUT is unset): gpu_all.json (summary: exit codes, times,
# wheels, shim, nvidia-smi), gpu_kernels_check.json, gpu_overhead.json, gpu_collectives.json,
# gpu_all.log. Exit status: 0 when every check is ok, 1 otherwise, 2 when there is no GPU.
# GPU_OVERHEAD_ARGS passes options to gpu_overhead.py, e.g. "--steps 200 --rounds 3".
set -u
cd "$(dirname "$0")/.."
START=$(date +%s)
BUDGET_S=${GPU_ALL_BUDGET_S:-480}
OUT=${OUT:-$PWD/gpu-out}
export OUT
mkdir -p "$OUT"
LOG=$OUT/gpu_all.log
PY=${PYTHON:-python3}
exec > >(tee -a "$LOG") 2>&1

left() { echo $((BUDGET_S - ($(date +%s) - START))); }
say() { echo "gpu_all [$(($(date +%s) - START)) s]: $*"; }

# 1. wheels
WHEELS=""
MISSING=""
for name in cupti_python orjson py_spy; do
    found=$(ls .whl/${name}-*.whl 2>/dev/null | head -1)
    if [ -n "$found" ]; then WHEELS="$WHEELS $found"; else MISSING="$MISSING $name"; fi
done
if [ -n "$WHEELS" ]; then
    if "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target /tmp/argus-site $WHEELS; then
        export PYTHONPATH=/tmp/argus-site${PYTHONPATH:+:$PYTHONPATH}
        export PATH=/tmp/argus-site/bin:$PATH
        say "installed:$WHEELS"
    else
        say "pip install of the carried wheels failed"
    fi
fi
[ -n "$MISSING" ] && say "missing wheels in .whl/:$MISSING"

# 2. the CUPTI callback shim (torch 2.11 has no native callbacks)
SHIM_ERR=$OUT/shim_build.txt
if SHIM=$("$PY" exporters/_native/build.py --only shim --out /tmp/argus-shim 2>"$SHIM_ERR"); then
    export ARGUS_CUPTI_SHIM=$SHIM
    say "shim: $SHIM"
else
    SHIM=""
    say "shim build failed: $(cat "$SHIM_ERR")"
fi
# the phase probe's bulk event reader (without it the resolver reads one event a call)
if EVENTS_LIB=$("$PY" exporters/_native/build.py --only events --out /tmp/argus-shim \
                2>"$SHIM_ERR"); then
    export ARGUS_EVENTS_LIB=$EVENTS_LIB
    say "event reader: $EVENTS_LIB"
else
    EVENTS_LIB=""
    say "event reader build failed: $(cat "$SHIM_ERR")"
fi
rm -f "$SHIM_ERR"

# 3. the checks, each under its own deadline and a hard timeout
KERNELS_S=$(( $(left) - 230 ))
[ "$KERNELS_S" -gt 240 ] && KERNELS_S=240
say "gpu_kernels_check (deadline ${KERNELS_S} s)"
timeout -k 10 $((KERNELS_S + 30)) "$PY" bench/gpu_kernels_check.py --deadline-s "$KERNELS_S" \
    --out "$OUT/gpu_kernels_check.json" >/dev/null
KERNELS_RC=$?
OVERHEAD_S=$(( $(left) - 90 ))
say "gpu_kernels_check exit $KERNELS_RC; gpu_overhead (deadline ${OVERHEAD_S} s)"
# shellcheck disable=SC2086  # GPU_OVERHEAD_ARGS is a list of options, split on purpose
timeout -k 10 $((OVERHEAD_S + 20)) "$PY" bench/gpu_overhead.py --deadline-s "$OVERHEAD_S" \
    --out "$OUT/gpu_overhead.json" ${GPU_OVERHEAD_ARGS:-} >/dev/null
OVERHEAD_RC=$?
say "gpu_overhead exit $OVERHEAD_RC; gpu_collectives"
timeout -k 10 60 "$PY" bench/gpu_collectives.py --out "$OUT/gpu_collectives.json" >/dev/null
COLLECTIVES_RC=$?
say "gpu_collectives exit $COLLECTIVES_RC"

# 4. the summary
KERNELS_RC=$KERNELS_RC OVERHEAD_RC=$OVERHEAD_RC COLLECTIVES_RC=$COLLECTIVES_RC SHIM=$SHIM EVENTS_LIB=$EVENTS_LIB MISSING=$MISSING WHEELS=$WHEELS \
ELAPSED=$(($(date +%s) - START)) "$PY" - <<'PYTHON'
import json, os, subprocess
from pathlib import Path

out = Path(os.environ["OUT"])
def load(name):
    path = out / name
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        return {"ok": False, "error": f"no result in {path}: {exc}"}
try:
    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                          "--format=csv,noheader"], capture_output=True, text=True,
                         timeout=20).stdout.strip()
except Exception as exc:
    smi = f"nvidia-smi: {exc}"
kernels, overhead = load("gpu_kernels_check.json"), load("gpu_overhead.json")
collectives = load("gpu_collectives.json")
codes = {"gpu_kernels_check": int(os.environ["KERNELS_RC"]),
         "gpu_overhead": int(os.environ["OVERHEAD_RC"]),
         "gpu_collectives": int(os.environ["COLLECTIVES_RC"])}
summary = {"ok": all(r.get("ok") is True for r in (kernels, overhead, collectives)),
           "exit": codes,
           "elapsed_s": int(os.environ["ELAPSED"]), "nvidia_smi": smi,
           "wheels": os.environ["WHEELS"].split(), "missing_wheels": os.environ["MISSING"].split(),
           "shim": os.environ["SHIM"] or None, "events_lib": os.environ["EVENTS_LIB"] or None,
           "kernels": {k: kernels.get(k) for k in ("ok", "error", "problems", "summary")},
           "overhead": {k: overhead.get(k) for k in ("ok", "error", "launch_heavy", "gemm_heavy",
                                                     "transformer", "probes", "dropped")},
           "collectives": {k: collectives.get(k) for k in ("ok", "error", "checks", "phases_ms",
                                                           "collective_overhead_cpu_us")}}
(out / "gpu_all.json").write_text(json.dumps(summary, indent=1, default=str) + "\n")
print(json.dumps(summary, default=str))
PYTHON
if [ "$KERNELS_RC" = 0 ] && [ "$OVERHEAD_RC" = 0 ] && [ "$COLLECTIVES_RC" = 0 ]; then exit 0; fi
if [ "$KERNELS_RC" = 2 ] || [ "$OVERHEAD_RC" = 2 ] || [ "$COLLECTIVES_RC" = 2 ]; then exit 2; fi
exit 1
