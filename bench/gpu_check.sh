#!/usr/bin/env bash
# bench/gpu_check.sh OUTDIR [--cpu-smoke]
#
# A GPU session's whole check, bounded to GPU_CHECK_SECONDS (default 285 s: under 5 minutes on an H200).
# Every stage runs under `timeout` with what is left of the budget (the report keeps a reserve), and each
# sweep gets a --time-budget inside that, so results are written even when a stage runs long.
#   1. python: the first of .venv/bin/python, python3, python that has torch with CUDA and triton;
#      `pip install -e . --no-deps` only if `import gemkernels` fails (or finds another checkout).
#   2. correctness: python -m pytest tests/select tests/kernels/test_kernels.py -x -q (every backend against the
#      float64 reference on CUDA, bf16 included; the Gram kernel against float64).
#   3. headline points (torch and every triton path, plus the -global greedy variants where n <= 256;
#      python -m bench): S=4096 n=256 d=1024 b=16 bf16; then the Gram tile candidates at that shape
#      (python -m bench.select_floor --only gram, into OUTDIR/floor/results.jsonl); S=256 n=4096 d=384 b=16
#      bf16 and fp32; S=1024 n=256 d=1024 fp32.
#   4. the --quick sweep.
#   5. report: OUTDIR/results.md, throughput.png, roofline.png from all of OUTDIR/results.jsonl.
# Set GEMKERNELS_GIT_COMMIT=<hash> when the tree has no .git, so the records name their commit.
# Writes OUTDIR/{results.jsonl,results.md,throughput.png,roofline.png,gpu_check.log,floor/results.jsonl}; ends
# with a summary (stages, the targets as ratios, the headline rows, the Gram tile rows). Exit status 1 if any
# stage failed or timed out.
#
# --cpu-smoke runs the same plumbing without a GPU (tiny sizes, Triton's interpreter), to test this script.

set -uo pipefail

if [ $# -lt 1 ]; then
    echo "usage: bench/gpu_check.sh OUTDIR [--cpu-smoke]" >&2
    exit 2
fi
mkdir -p "$1" && OUT=$(cd "$1" && pwd)
SMOKE=0
[ "${2:-}" = "--cpu-smoke" ] && SMOKE=1
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO" || exit 2
LOG="$OUT/gpu_check.log"
exec > >(tee -a "$LOG") 2>&1

TOTAL=${GPU_CHECK_SECONDS:-285}
RESERVE=25  # seconds kept for the report stage
T0=$(date +%s)
SUMMARY=()
FAILED=0
export TQDM_DISABLE=1  # no progress bar in a log; each point still prints one line
# Records carry the commit; a copy of the tree without .git (a lent GPU machine) needs it passed in.
if [ -z "${GEMKERNELS_GIT_COMMIT:-}" ] && COMMIT=$(git -C "$REPO" rev-parse HEAD 2>/dev/null); then
    export GEMKERNELS_GIT_COMMIT=$COMMIT
fi

left() { echo $((TOTAL - ($(date +%s) - T0))); }
log() { echo "[gpu_check +$(($(date +%s) - T0))s] $*"; }

# The seconds a stage may take: min(CAP, time left - RESERVE).
stage_limit() {
    local cap=$1 avail
    avail=$(($(left) - RESERVE))
    echo $((cap < avail ? cap : avail))
}

# run_stage NAME LIMIT CMD...: run CMD under `timeout LIMIT` (skipped under 10 s) and note how it went.
run_stage() {
    local name=$1 limit=$2 start rc took
    shift 2
    if [ "$limit" -lt 10 ]; then
        log "stage $name skipped: $(left) s of the budget left"
        SUMMARY+=("$name: skipped (budget spent)")
        FAILED=1
        return
    fi
    log "== $name (limit ${limit} s): $*"
    start=$(date +%s)
    timeout --kill-after=5 "$limit" "$@"
    rc=$?
    took=$(($(date +%s) - start))
    if [ $rc -eq 0 ]; then
        SUMMARY+=("$name: ok in ${took} s")
        return
    fi
    FAILED=1
    if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
        SUMMARY+=("$name: TIMED OUT after ${took} s")
    else
        SUMMARY+=("$name: FAILED (exit $rc) after ${took} s")
    fi
}

# stage NAME CAP CMD...: run_stage with the limit stage_limit gives.
stage() {
    local name=$1 cap=$2
    shift 2
    run_stage "$name" "$(stage_limit "$cap")" "$@"
}

# bench_stage NAME CAP ARGS...: python -m bench into OUTDIR, with a time budget inside the stage's limit.
bench_stage() {
    local name=$1 limit
    limit=$(stage_limit "$2")
    shift 2
    run_stage "$name" "$limit" "$PY" -m bench --out "$OUT" --no-plots --device "$DEVICE" \
        --time-budget $((limit > 40 ? limit - 25 : limit / 2)) "$@" ${SMOKE_ARGS[@]+"${SMOKE_ARGS[@]}"}
}

# ---------------------------------------------------------------- 1. python and the package
SMOKE_ARGS=()
if [ $SMOKE -eq 1 ]; then
    DEVICE=cpu
    export TRITON_INTERPRET=1
    NEEDS='import torch, triton'
    SMOKE_ARGS=(--repeats 3)  # the interpreter takes about a second a call even at these sizes
else
    DEVICE=cuda
    NEEDS='import torch, triton; assert torch.cuda.is_available()'
fi
PY=""
for candidate in "$REPO/.venv/bin/python" python3 python; do
    if command -v "$candidate" >/dev/null 2>&1 && timeout 120 "$candidate" -c "$NEEDS" >/dev/null 2>&1; then
        PY=$candidate
        break
    fi
done
if [ -z "$PY" ]; then
    log "no python with torch (CUDA) and triton found among .venv/bin/python, python3, python"
    exit 1
fi
log "python: $PY"

importable() {
    "$PY" -c "import os, gemkernels, gemkernels.kernels
assert os.path.realpath(gemkernels.__file__).startswith(os.path.realpath('$REPO') + os.sep), gemkernels.__file__" \
        >/dev/null 2>&1
}
if ! importable; then
    log "gemkernels is not importable from this checkout: pip install -e . --no-deps"
    "$PY" -m pip install -q -e . --no-deps --no-build-isolation || "$PY" -m pip install -q -e . --no-deps
    if ! importable; then
        # Last resort: the source tree itself (gemkernels loads kernels/ as gemkernels.kernels without an install).
        log "pip install failed; importing from the source tree"
        export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
        importable || { log "gemkernels still not importable"; exit 1; }
    fi
fi

log "machine:"
timeout 20 nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem,power.limit \
    --format=csv 2>/dev/null || echo "(no nvidia-smi)"
timeout 60 "$PY" -c "import sys, numpy, torch, triton, gemkernels
print('python', sys.version.split()[0], 'numpy', numpy.__version__, 'torch', torch.__version__, 'triton',
      triton.__version__, 'cuda', torch.version.cuda, 'device', torch.cuda.get_device_name() if torch.cuda.is_available() else None)"

# ---------------------------------------------------------------- 2. correctness
if [ $SMOKE -eq 1 ]; then
    stage correctness 120 "$PY" -m pytest tests/select/test_contract.py -x -q -p no:cacheprovider -k "numpy and random"
else
    stage correctness 120 "$PY" -m pytest tests/select tests/kernels/test_kernels.py -x -q -p no:cacheprovider
fi

# ---------------------------------------------------------------- 3. headline points, gram tiles, quick sweep
PATHS=(torch triton-gram triton-fused triton-stepwise)
VARIANTS=(triton-gram-global triton-fused-global)  # the greedy state in global memory: A/B for the resident one
if [ $SMOKE -eq 1 ]; then
    HEAD=(-S 1 -n 8 -d 16) LONG=(-S 1 -n 32 -d 16) SERVE=(-S 2 -n 8 -d 16) QUICK=(-S 1 -n 8 16 -d 16)
else
    HEAD=(-S 4096 -n 256 -d 1024) LONG=(-S 256 -n 4096 -d 384) SERVE=(-S 1024 -n 256 -d 1024) QUICK=(--quick)
fi
TARGET=(--mode fixed -b 16 --point-seconds 2)  # about 2 s of timed runs a point
bench_stage headline-bf16 60 "${HEAD[@]}" --dtype bf16 --backend "${PATHS[@]}" "${VARIANTS[@]}" "${TARGET[@]}"
stage gram-tiles 40 "$PY" -m bench.select_floor --only gram --out "$OUT/floor"
bench_stage long-history 45 "${LONG[@]}" --dtype bf16 fp32 --backend "${PATHS[@]}" "${TARGET[@]}"
bench_stage serving-fp32 35 "${SERVE[@]}" --dtype fp32 --backend "${PATHS[@]}" "${VARIANTS[@]}" "${TARGET[@]}"
bench_stage quick-sweep 60 "${QUICK[@]}" --backend "${PATHS[@]}"

# ---------------------------------------------------------------- 5. report
RESERVE=0
if [ -s "$OUT/results.jsonl" ]; then
    stage report 25 "$PY" -m bench --out "$OUT" --report-only
else
    SUMMARY+=("report: nothing to report (no results.jsonl)")
    FAILED=1
fi

echo
log "summary (budget ${TOTAL} s, $(left) s left)"
printf '  %s\n' "${SUMMARY[@]}"
if [ -s "$OUT/results.md" ]; then
    sed -n '/^## Targets/,/^## Measurements/p' "$OUT/results.md" | sed '$d'
    echo "headline rows (dtype | S | n | d | backend | median | GB/s | % copy BW | % matmul | % roofline |" \
        "/ read X once | vs torch | same as torch):"
    grep -E '^\| [a-z]+ \| fixed \| (bf16|fp32) \| (4096 \| 256 \| 1024|256 \| 4096 \| 384|1024 \| 256 \| 1024) \|' \
        "$OUT/results.md" | cut -d'|' -f4-9,14-20
fi
if [ -s "$OUT/floor/results.jsonl" ]; then
    echo "gram tile rows (measurement, dtype, median, ratios):"
    "$PY" -c "import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    print(' ', r['measurement'], r['config'].get('dtype'), r['median_s'], r.get('ratios') or r.get('error'))" \
        "$OUT/floor/results.jsonl"
fi
exit $FAILED
