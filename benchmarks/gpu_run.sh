#!/usr/bin/env bash
# The whole GPU proof in one command, on a machine with a GPU and no network:
#
#     benchmarks/gpu_run.sh OUT            (PYTHON=/path/to/python3 to choose the interpreter)
#
# Budget (wall seconds), inside the device tool's 600 s for one command:
#
#     stage         budget  what                                       leaves in OUT
#     environment      20   nvidia-smi, Python, CuPy, PyTorch versions gpu_run.txt
#     selftest        340   minidl selftest --device cuda --out OUT    selftest.json (rewritten after each
#                           (its imports, then six stages under 270 s  stage), summary.txt
#                           of limits: docs/gpu.md)
#     pack                  the selftest's log and PNGs into one       gpu_run_rest.tar.gz
#                           archive
#     pytest          200   pytest -m cuda -o addopts= -n 8 -v -rfE:   pytest.txt (one line per test id, so
#                           every test that runs minidl on "cuda"      a timeout shows where it was)
#     total           560   (timeout's --kill-after adds at most 10 s to a stage that ignores SIGTERM)
#
# OUT ends with 5 files, none in a subfolder, each under 16 MiB: the device tool returns at most 8,
# so a caller has room for 3 of its own. Every stage runs under `timeout`; one that fails or runs
# out of time is recorded in OUT/gpu_run.txt and the next one runs. Exit status: 0 when every stage
# passed, 1 otherwise.
#
# How the budgets were measured (docs/gpu.md, "The whole run on a machine without network"): this
# script on the CuPy stand-in, the full selftest (MINIDL_SELFTEST="$PYTHON -m tests.cupy_standin
# selftest --device cuda", not --quick) and the same `-m cuda` selection run serially (-n 0 -v -rfE),
# in fresh interpreters with an empty CuPy kernel cache (CUPY_CACHE_DIR=$(mktemp -d)) and no bytecode
# cache (__pycache__ removed, PYTHONDONTWRITEBYTECODE=1), on two CPU cores shared with other work:
#     environment   1 s
#     selftest    158 s  imports up front 10.5 s (PyTorch among them); the speed stage ran into its
#                        limit and stopped 6.6 s after it (the alarm's 5 s grace, then 1.6 s inside a
#                        call an alarm cannot interrupt); the other stages ended sooner
#     pytest      184 s  499 passed, 4 skipped (165 s inside pytest, collection included)
# On a GPU every selftest stage may run into its limit: its worst case is bounded by the stages'
# limits plus, each, the alarm's grace and one uninterruptible call (measured 1.6 s; a kernel's
# first NVRTC compile on a cold cache is about 0.2 s, tests/optim/test_nvrtc_compile.py), plus the
# imports: 270 + 6 x (5 + 2) + 15 = 327 s, budgeted 340 s. pytest: 184 s measured serially on two
# shared cores, budgeted 200 s (8 workers on the GPU machine's 16 cores, each compiling the CuPy
# kernels it meets first, fit in it with room).
#
# For a checkout without installing (no network needed): the script runs from the repository
# root with PYTHONPATH set to it. These variables change what runs (the tests use them):
#     PYTHON               the interpreter                      (python3, as the GPU image documents)
#     MINIDL_SELFTEST      the selftest command before --out   ($PYTHON -m minidl selftest --device cuda)
#     GPU_RUN_PYTEST_ARGS  pytest's arguments                   (-m cuda -o addopts= -n 8 -v -rfE tests)
#     GPU_RUN_SELFTEST_S, GPU_RUN_PYTEST_S, GPU_RUN_ENVIRONMENT_S   the budgets above
set -u

if [ $# -ne 1 ]; then
    echo "usage: benchmarks/gpu_run.sh OUT   (OUT: the folder for the results)" >&2
    exit 2
fi
OUT=$1
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PYTHON=${PYTHON:-python3}
SELFTEST=${MINIDL_SELFTEST:-"$PYTHON -m minidl selftest --device cuda"}
PYTEST_ARGS=${GPU_RUN_PYTEST_ARGS:-"-m cuda -o addopts= -n 8 -v -rfE tests"}
ENVIRONMENT_S=${GPU_RUN_ENVIRONMENT_S:-20}
SELFTEST_S=${GPU_RUN_SELFTEST_S:-340}
PYTEST_S=${GPU_RUN_PYTEST_S:-200}
MAX_BYTES=$((16 * 1024 * 1024 - 4096))  # the device tool returns files of up to 16 MiB
REST=gpu_run_rest.tar.gz                # the selftest's log and figures, in one file

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
# the selftest's log and figures go into one archive: OUT keeps room under the 8 files returned
rm -f "$OUT/.lock" "$OUT/$REST"  # the selftest's (empty) claim on its folder, and an earlier run's archive
packed=$(cd "$OUT" && ls selftest.log roofline.png step_profile.png 2>/dev/null)
if [ -n "$packed" ]; then
    # shellcheck disable=SC2086
    (cd "$OUT" && tar -czf "$REST" $packed && rm -f $packed) || FAILED=1
    echo "packed      $(echo $packed) into $REST ($(wc -c < "$OUT/$REST") bytes)" | tee -a "$REPORT"
fi
# shellcheck disable=SC2086
stage pytest "$PYTEST_S" "$OUT/pytest.txt" "$PYTHON" -m pytest $PYTEST_ARGS

echo "total $(( $(date +%s) - STARTED ))s; $([ $FAILED -eq 0 ] && echo 'every stage passed' || echo 'a stage failed')" \
    | tee -a "$REPORT"
exit $FAILED
