#!/usr/bin/env bash
# bench/gpu_check.sh OUTDIR [--cpu-smoke | --plan]
#
# A GPU session's whole check in one run, bounded to GPU_CHECK_SECONDS (default 285 s: under 5 minutes on an
# H200), measuring first: the plan below is printed with its caps, which add up inside the budget (the script
# refuses to start otherwise). Every stage runs under `timeout` (SIGINT, so pytest and the sweeps still print what
# they have) with min(its cap, what is left after the report's cap); a stage that fails or times out is noted and
# the next one runs.
#   setup:       the first of .venv/bin/python, python3, python with torch (CUDA) and triton; `pip install -e .
#                --no-deps` (offline) only if `import gemkernels` fails (or finds another checkout); nvidia-smi;
#                versions; whether pytest and hypothesis are there and Triton can launch one kernel.
#   targets:     both headline targets first, in one sweep (ceilings measured once; python -m bench.gpu_checks
#                targets): S=4096 n=256 d=1024 bf16 (torch, every triton path, the -global variants), then
#                S=256 n=4096 d=384 bf16 and fp32.
#   correctness: pytest tests/select tests/kernels/test_kernels.py tests/kernels/test_kernel_arithmetic.py on CUDA,
#                every failure listed (no -x).
#   checks:      python -m bench.gpu_checks checks: each path 20 times on a small-tile batch (identical bits),
#                agreement with torch and sampled sessions replayed through the float64 reference at the headline
#                shapes, one stepwise call past 2^31 elements, a torch.profiler breakdown of one call, registers
#                and spills of what ran from the JIT cache; then every path at tiny shapes, compiled for:
#   memcheck, racecheck, synccheck: compute-sanitizer's tools on every path at tiny shapes, PyTorch's caching
#                allocator off (skipped, with a note, where compute-sanitizer is neither on PATH nor in CUDA_HOME).
#   serving:     S=1024 n=256 d=1024 fp32 (with the -global variants).
#   gram-tiles:  the Gram tile candidates at the headline shape (python -m bench.select_floor --only gram).
#   report:      OUTDIR/results.md, throughput.png, roofline.png from OUTDIR/results.jsonl.
# Set GEMKERNELS_GIT_COMMIT=<hash> when the tree has no .git, so the records name their commit.
# Writes OUTDIR/{results.jsonl,results.md,throughput.png,roofline.png,gpu_check.log,floor/results.jsonl}; ends
# with a summary (each stage's status and time, the targets as ratios, the headline rows, the Gram tile rows).
# Exit status 1 if any stage failed or timed out.
#
# --cpu-smoke runs the same plumbing without a GPU (tiny sizes, Triton's interpreter), to test this script;
# --plan prints the plan and its budget and exits (0 when the caps fit the budget).

set -uo pipefail

if [ $# -lt 1 ]; then
    echo "usage: bench/gpu_check.sh OUTDIR [--cpu-smoke | --plan]" >&2
    exit 2
fi
MODE=${2:-gpu}
case $MODE in gpu | --cpu-smoke | --plan) ;; *) echo "unknown option $MODE" >&2; exit 2 ;; esac
SMOKE=0
[ "$MODE" = "--cpu-smoke" ] && SMOKE=1
TOTAL=${GPU_CHECK_SECONDS:-285}

# ---------------------------------------------------------------- the plan: stage, cap (s), what it measures
PLAN=(
    "setup 20 python, the package, nvidia-smi, versions"
    "targets 75 S=4096 n=256 d=1024 bf16; S=256 n=4096 d=384 bf16+fp32 (one sweep, ceilings once)"
    "correctness 55 pytest tests/select + kernel tests on CUDA, every failure listed"
    "checks 45 races x20, agreement + float64 replay, past 2^31, profiler, JIT registers"
    "memcheck 12 compute-sanitizer --tool memcheck, every path at tiny shapes"
    "racecheck 12 compute-sanitizer --tool racecheck, the same"
    "synccheck 10 compute-sanitizer --tool synccheck, the same"
    "serving 20 S=1024 n=256 d=1024 fp32 (with -global)"
    "gram-tiles 20 Gram tile candidates at the headline shape"
    "report 15 results.md and the plots"
)
PLANNED=0
print_plan() {
    local line name cap
    echo "plan (budget ${TOTAL} s):"
    for line in "${PLAN[@]}"; do
        read -r name cap rest <<<"$line"
        printf '  %-12s %4d s  %s\n' "$name" "$cap" "$rest"
    done
    printf '  %-12s %4d s  (of %d s)\n' total "$PLANNED" "$TOTAL"
}
for line in "${PLAN[@]}"; do
    read -r _ cap _ <<<"$line"
    PLANNED=$((PLANNED + cap))
done
if [ "$MODE" = "--plan" ]; then
    print_plan
    [ "$PLANNED" -le "$TOTAL" ]
    exit
fi

mkdir -p "$1" && OUT=$(cd "$1" && pwd)
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO" || exit 2
LOG="$OUT/gpu_check.log"
exec > >(tee -a "$LOG") 2>&1
TEE=$!
# Every line reaches the log as it is printed, so a stage killed at its limit still leaves what it said.
export PYTHONUNBUFFERED=1

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
print_plan
if [ "$PLANNED" -gt "$TOTAL" ]; then
    log "the plan's caps add up to ${PLANNED} s, over the ${TOTAL} s budget"
    exit 2
fi

# The seconds stage NAME may take: min(its cap, time left - the report's cap); the report itself gets what is left.
# Under --cpu-smoke a cap counts double: the caps are a GPU's, and Triton's interpreter on a shared 2-core CI
# machine once took 21 s of the serving stage's 20 (the smoke tests the plumbing, not the timings).
stage_limit() {
    local name=$1 cap reserve line
    for line in "${PLAN[@]}"; do
        read -r stage c _ <<<"$line"
        [ "$stage" = "$name" ] && cap=$((c * (SMOKE + 1)))
        [ "$stage" = report ] && reserve=$c
    done
    [ "$name" = report ] && reserve=0
    local avail=$(($(left) - reserve))
    echo $((cap < avail ? cap : avail))
}

# stage NAME CMD...: run CMD under `timeout` (SIGINT first, then KILL) with stage_limit NAME (skipped under 5 s).
stage() {
    local name=$1 limit start rc took
    shift
    limit=$(stage_limit "$name")
    if [ "$limit" -lt 5 ]; then
        log "stage $name skipped: $(left) s of the budget left"
        SUMMARY+=("$name: skipped (budget spent)")
        FAILED=1
        return
    fi
    log "== $name (limit ${limit} s): $*"
    start=$(date +%s)
    timeout --signal=INT --kill-after=5 "$limit" "$@"
    rc=$?
    took=$(($(date +%s) - start))
    if [ $rc -eq 0 ]; then
        SUMMARY+=("$name: ok in ${took} s")
        return
    fi
    FAILED=1
    if [ $rc -eq 124 ] || [ $rc -eq 137 ] || [ $rc -eq 130 ]; then
        SUMMARY+=("$name: TIMED OUT after ${took} s (limit ${limit} s)")
    else
        SUMMARY+=("$name: FAILED (exit $rc) after ${took} s")
    fi
}

# ---------------------------------------------------------------- setup: python and the package
SETUP_START=$(date +%s)
if [ $SMOKE -eq 1 ]; then
    DEVICE=cpu
    export TRITON_INTERPRET=1
    NEEDS='import torch, triton'
    SMOKE_ARGS=(--smoke)
else
    DEVICE=cuda
    NEEDS='import torch, triton; assert torch.cuda.is_available()'
    # fewer examples of the contract's property tests (40 on CPU): each new shape compiles on a cold Triton cache
    export GK_HYPOTHESIS_EXAMPLES=${GK_HYPOTHESIS_EXAMPLES:-10}
    SMOKE_ARGS=()
fi
PY=""
for candidate in "$REPO/.venv/bin/python" python3 python; do
    if command -v "$candidate" >/dev/null 2>&1 && timeout 60 "$candidate" -c "$NEEDS" >/dev/null 2>&1; then
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
    timeout 60 "$PY" -m pip install -q -e . --no-deps --no-build-isolation --no-index  # offline: no build deps to fetch
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
timeout 30 "$PY" -c "import sys, numpy, torch, triton, gemkernels
print('python', sys.version.split()[0], 'numpy', numpy.__version__, 'torch', torch.__version__, 'triton',
      triton.__version__, 'cuda', torch.version.cuda, 'device', torch.cuda.get_device_name() if torch.cuda.is_available() else None)"
if ! timeout 10 "$PY" -c "import pytest, hypothesis" >/dev/null 2>&1; then
    log "pytest or hypothesis is not installed for $PY: the correctness stage's property tests will skip"
    SUMMARY+=("setup: WARNING pytest/hypothesis missing (correctness runs few tests)")
    FAILED=1
fi
if ! timeout 120 "$PY" -m bench.gpu_checks probe ${SMOKE_ARGS[@]+"${SMOKE_ARGS[@]}"} 2>&1 | tail -3; then
    log "Triton cannot launch a kernel here (a C compiler, ptxas?): every Triton stage below will fail"
    SUMMARY+=("setup: Triton CANNOT LAUNCH a kernel")
    FAILED=1
fi
SUMMARY+=("setup: done in $(($(date +%s) - SETUP_START)) s")

# ---------------------------------------------------------------- the stages, in the plan's order
# the sweep's deadline counts from here (python and torch start inside it), a point's worth before the limit
stage targets "$PY" -m bench.gpu_checks targets "$OUT" --deadline $(($(date +%s) + $(stage_limit targets) - 15)) \
    ${SMOKE_ARGS[@]+"${SMOKE_ARGS[@]}"}

if [ $SMOKE -eq 1 ]; then
    stage correctness "$PY" -m pytest tests/select/test_contract.py -q -p no:cacheprovider -k "numpy and random"
else
    stage correctness "$PY" -m pytest tests/select tests/kernels/test_kernels.py tests/kernels/test_kernel_arithmetic.py \
        -q -p no:cacheprovider -rf --durations=10
fi

stage checks "$PY" -m bench.gpu_checks checks ${SMOKE_ARGS[@]+"${SMOKE_ARGS[@]}"}

SANITIZER=$(command -v compute-sanitizer || true)
[ -z "$SANITIZER" ] && [ -x "${CUDA_HOME:-/usr/local/cuda}/bin/compute-sanitizer" ] &&
    SANITIZER=${CUDA_HOME:-/usr/local/cuda}/bin/compute-sanitizer
for tool in memcheck racecheck synccheck; do
    if [ -n "$SANITIZER" ] && [ $SMOKE -eq 0 ]; then
        # without PyTorch's caching allocator, so that a read past a tensor is past an allocation memcheck sees
        stage $tool env PYTORCH_NO_CUDA_MEMORY_CACHING=1 "$SANITIZER" --tool $tool --error-exitcode 1 \
            "$PY" -m bench.gpu_checks tiny
    else
        log "stage $tool skipped: compute-sanitizer is not installed (or --cpu-smoke)"
        SUMMARY+=("$tool: skipped (no compute-sanitizer)")
    fi
done

if [ $SMOKE -eq 1 ]; then
    SERVE=(-S 2 -n 8 -d 16 --repeats 3 --point-seconds 0.05)
else
    SERVE=(-S 1024 -n 256 -d 1024 --point-seconds 2)
fi
stage serving "$PY" -m bench --out "$OUT" --no-plots --device "$DEVICE" "${SERVE[@]}" --dtype fp32 --mode fixed \
    -b 16 --backend torch triton-gram triton-fused triton-stepwise triton-gram-global triton-fused-global
stage gram-tiles "$PY" -m bench.select_floor --only gram --out "$OUT/floor"

if [ -s "$OUT/results.jsonl" ]; then
    stage report "$PY" -m bench --out "$OUT" --report-only
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
exec >&- 2>&-  # the log's tee sees the end of its input: give it up to 5 s to write the last lines
for _ in $(seq 50); do
    kill -0 "$TEE" 2>/dev/null || break
    sleep 0.1
done
exit $FAILED
