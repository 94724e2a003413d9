#!/usr/bin/env bash
# The whole GPU proof in one command, on a machine with a GPU and no network:
#
#     benchmarks/gpu_run.sh OUT
#
# Budget (wall seconds), inside 8 minutes on one H100, CuPy's first-call compiles included:
#
#     stage         budget  what                                       writes into OUT
#     environment      20   nvidia-smi, Python, CuPy, PyTorch versions gpu_run.txt
#     selftest        310   minidl selftest --device cuda --out OUT    selftest.json (rewritten after each
#                           (six stages, 270 s of limits: docs/gpu.md) stage), summary.txt, roofline.png,
#                                                                      step_profile.png, selftest.log
#     pytest          130   pytest -m cuda -o addopts= -n 8: every     pytest.txt
#                           test that runs minidl on "cuda", real CuPy
#     total           460
#
# Every stage runs under `timeout`; one that fails or runs out of time is recorded in
# OUT/gpu_run.txt and the next one runs. OUT gets at most 8 files, none in a subfolder.
# Exit status: 0 when every stage passed, 1 otherwise.
#
# For a checkout without installing (no network needed): the script runs from the repository
# root with PYTHONPATH set to it. These variables change what runs (the tests use them):
#     MINIDL_SELFTEST      the selftest command before --out   (python -m minidl selftest --device cuda)
#     GPU_RUN_PYTEST_ARGS  pytest's arguments                   (-m cuda -o addopts= -n 8 -q tests)
#     GPU_RUN_SELFTEST_S, GPU_RUN_PYTEST_S, GPU_RUN_ENVIRONMENT_S   the budgets above
set -u

if [ $# -ne 1 ]; then
    echo "usage: benchmarks/gpu_run.sh OUT   (OUT: the folder for the results)" >&2
    exit 2
fi
OUT=$1
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PYTHON=${PYTHON:-python}
SELFTEST=${MINIDL_SELFTEST:-"$PYTHON -m minidl selftest --device cuda"}
PYTEST_ARGS=${GPU_RUN_PYTEST_ARGS:-"-m cuda -o addopts= -n 8 -q tests"}
ENVIRONMENT_S=${GPU_RUN_ENVIRONMENT_S:-20}
SELFTEST_S=${GPU_RUN_SELFTEST_S:-310}
PYTEST_S=${GPU_RUN_PYTEST_S:-130}
MAX_BYTES=$((16 * 1024 * 1024 - 4096))

mkdir -p "$OUT" || exit 2
OUT=$(cd "$OUT" && pwd)
cd "$ROOT" || exit 2
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
REPORT="$OUT/gpu_run.txt"
: > "$REPORT"
FAILED=0
STARTED=$(date +%s)

# stage NAME BUDGET LOG COMMAND...: run COMMAND under timeout, output into LOG; one line into the report
stage() {
    local name=$1 budget=$2 log=$3
    shift 3
    local begin rc status
    begin=$(date +%s)
    timeout --kill-after=10 "$budget" "$@" > "$log" 2>&1
    rc=$?
    case $rc in
        0) status=passed ;;
        124|137) status="timed out" ;;
        *) status=failed ;;
    esac
    [ $rc -eq 0 ] || FAILED=1
    # keep the log's end under the size limit (a runaway log must not break the results)
    if [ "$(wc -c < "$log")" -gt $MAX_BYTES ]; then
        tail -c $MAX_BYTES "$log" > "$log.tmp" && mv "$log.tmp" "$log"
    fi
    printf '%-12s %-9s %4ss of %4ss  exit %s  %s\n' "$name" "$status" "$(( $(date +%s) - begin ))" "$budget" \
        "$rc" "$(tail -n 1 "$log" | cut -c 1-160)" | tee -a "$REPORT"
}

environment() {
    echo "date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
    echo "commit: $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?')"
    nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader 2>&1 || true
    "$PYTHON" - <<'PY'
import platform
from importlib import metadata
print("python", platform.python_version())
for name in ("numpy", "cupy-cuda13x", "cupy-cuda12x", "torch", "scipy", "mpi4py", "nvidia-nccl-cu13",
             "nvidia-nccl-cu12", "pytest", "pytest-xdist", "hypothesis", "ml_dtypes"):
    try:
        print(name, metadata.version(name))
    except metadata.PackageNotFoundError:
        print(name, "absent")
PY
}

{
    echo "benchmarks/gpu_run.sh $OUT"
    echo "budgets: environment ${ENVIRONMENT_S}s, selftest ${SELFTEST_S}s, pytest ${PYTEST_S}s"
} > "$REPORT"
export -f environment
export PYTHON ROOT
stage environment "$ENVIRONMENT_S" "$OUT/environment.tmp" bash -c environment
cat "$OUT/environment.tmp" >> "$REPORT" && rm -f "$OUT/environment.tmp"

# shellcheck disable=SC2086  # the commands are word-split on purpose
stage selftest "$SELFTEST_S" "$OUT/selftest.log" $SELFTEST --out "$OUT" --overwrite  # a rerun replaces its results
# shellcheck disable=SC2086
stage pytest "$PYTEST_S" "$OUT/pytest.txt" "$PYTHON" -m pytest $PYTEST_ARGS

echo "total $(( $(date +%s) - STARTED ))s; $([ $FAILED -eq 0 ] && echo 'every stage passed' || echo 'a stage failed')" \
    | tee -a "$REPORT"
exit $FAILED
