#!/usr/bin/env bash
# ci/gpu-check's dry run on a machine without a GPU (issue 15 item 6): a stand-in nvidia-smi on
# PATH that describes an H200, no CUDA device, the binaries of the build folder given as $1 (no
# bundle). Checks, twice (a 30 s budget, then the smallest, 10 s):
#   - it ends within its budget (measured from outside, 1 s allowed for starting bash);
#   - OUT holds exactly gpu-check-logs.tar.gz, summary.json and summary.txt (the device tool
#     brings back at most 8 files), the archive holds the step records, summary.json parses and
#     names every step with a status;
#   - it fails (exit 1): no step that needs the device may pass without one;
#   - with 30 s the device facts came from the stand-in, and the op tests ran each in its own
#     process (their per-test records are there);
#   - with 30 s, a stand-in ldd reports NCCL missing for tandem: the op tests still run, tandem's
#     steps are skipped as unable to load;
#   - with 10 s and an nvidia-smi that hangs, its step is killed at its timeout, the steps after it
#     are skipped for the budget, and the files still come back in time.
# Kind of check: exact (files, exit status, names); the time bound is the script's own budget.
# Usage: tests/gpu_check_dry_run_test.sh BUILD_DIR     Exit status: 0 when every check holds.
set -uo pipefail
build="$(cd "${1:?usage: $0 BUILD_DIR}" && pwd)"
root="$(cd "$(dirname "$0")/.." && pwd)"
work="$(mktemp -d "${TMPDIR:-/tmp}/gpu-check-dry-run.XXXXXX")"
trap 'rm -rf "$work"' EXIT
failures=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }

mkdir -p "$work/bin"
cat >"$work/bin/nvidia-smi" <<'SMI'
#!/usr/bin/env bash
# A stand-in for nvidia-smi (tests/gpu_check_dry_run_test.sh): an H200's answers, no device behind.
case "${1:-}" in
  -L) echo "GPU 0: NVIDIA H200 (UUID: GPU-00000000-stand-in)" ;;
  --query-gpu=*) echo "name, uuid, driver_version, memory.total [MiB]"
    echo "NVIDIA H200, GPU-00000000-stand-in, 580.159.03, 143771 MiB" ;;
  -q) echo "Product Name : NVIDIA H200 (stand-in)"
    # A hung driver, on request: the step must be killed at its timeout and the run go on.
    [ -n "${STAND_IN_NVIDIA_SMI_HANGS:-}" ] && sleep 600 ;;
  *) echo "stand-in nvidia-smi: $*" ;;
esac
SMI
chmod +x "$work/bin/nvidia-smi"
# For the first run: an ldd that reports NCCL missing for tandem alone (which links it); the op
# tests and benchmarks need only cudart and cuBLASLt, so they must still run.
mkdir -p "$work/no-nccl"
real_ldd="$(command -v ldd)"
cat >"$work/no-nccl/ldd" <<LDD
#!/usr/bin/env bash
"$real_ldd" "\$@" | grep -v libnccl
case "\$1" in */tandem) echo "	libnccl.so.2 => not found" ;; esac
LDD
chmod +x "$work/no-nccl/ldd"

# dry_run NAME BUDGET_S: runs ci/gpu-check into $work/NAME; sets rc and elapsed_ms.
dry_run() {
  local begin end
  mkdir -p "$work/$1"
  begin=$(date +%s%N)
  PATH="$work/bin:${extra_path:-}$PATH" TANDEM_GPU_CHECK_BUILD="$build" TANDEM_GPU_CHECK_BUDGET_S="$2" \
    CUDA_VISIBLE_DEVICES="" "$root/ci/gpu-check" "$work/$1/out" >"$work/$1/stdout" 2>"$work/$1/stderr"
  rc=$?
  end=$(date +%s%N)
  elapsed_ms=$(((end - begin) / 1000000))
  echo "dry run $1 (budget $2 s): exit $rc in $elapsed_ms ms"
  cat "$work/$1/stdout"
}

# common_checks NAME BUDGET_S
common_checks() {
  local files
  ((elapsed_ms <= ($2 + 1) * 1000)) || fail "$1: took $elapsed_ms ms, over its $2 s budget"
  [ "$rc" = 1 ] || fail "$1: exit $rc; without a device it must fail (1)"
  files="$(cd "$work/$1/out" && find . -mindepth 1 | sort | tr '\n' ' ')"
  [ "$files" = "./gpu-check-logs.tar.gz ./summary.json ./summary.txt " ] ||
    fail "$1: OUT holds '$files', not exactly the archive, summary.json and summary.txt"
  tar -tzf "$work/$1/out/gpu-check-logs.tar.gz" >"$work/$1/archive.txt" 2>&1 || fail "$1: the archive does not read"
  grep -qx "gpu-check/steps.tsv" "$work/$1/archive.txt" || fail "$1: the archive lacks gpu-check/steps.tsv"
  python3 - "$work/$1/out/summary.json" "$1" <<'PY' || fail "$1: summary.json (above)"
import json, sys
summary = json.load(open(sys.argv[1]))
problems = []
if summary.get("passed") is not False:
    problems.append(f"passed = {summary.get('passed')!r}, must be false without a device")
steps = summary.get("steps", [])
names = [step["name"] for step in steps]
for name in ("device_facts", "libraries", "cuda_ops_tests", "bench_gemm", "train_bench", "equivalence_cuda",
             "cuda_ops_tests_async"):
    if name not in names:
        problems.append(f"no step named {name} (steps: {names})")
for step in steps:
    if not step.get("status"):
        problems.append(f"step {step.get('name')} has no status")
    device_steps = ("cuda_ops_tests", "bench_gemm", "bench_attention", "bench_update", "train_bench", "audit_cuda",
                    "train_cuda", "check_cuda", "equivalence_cuda", "cuda_ops_tests_async")
    if step["name"] in device_steps and step["status"] == "passed":
        problems.append(f"step {step['name']} passed without a device")
for problem in problems:
    print(f"{sys.argv[2]}: {problem}", file=sys.stderr)
sys.exit(1 if problems else 0)
PY
}

extra_path="$work/no-nccl:" dry_run budget30 30
common_checks budget30 30
grep -q "NVIDIA H200" "$work/budget30/out/summary.json" || fail "budget30: the stand-in's device facts are not in summary.json"
python3 - "$work/budget30/out/summary.json" <<'PY' || fail "budget30: the op tests' per-process records (above)"
import json, sys
tests = json.load(open(sys.argv[1]))["cuda_ops_tests"]
if len(tests) < 2:
    sys.exit(f"budget30: {len(tests)} op test records; expected one per test")
first = tests[0]["test"]
if "Gemm" not in first and "Attention" not in first:
    sys.exit(f"budget30: the first op test is {first}; GEMM and attention go first")
PY

python3 - "$work/budget30/out/summary.json" <<'PY' || fail "budget30: a missing NCCL (above)"
import json, sys
summary = json.load(open(sys.argv[1]))
steps = {step["name"]: step["status"] for step in summary["steps"]}
if "tandem" not in steps["libraries"] or "libnccl.so.2" not in steps["libraries"]:
    sys.exit(f"budget30: libraries = {steps['libraries']!r}; it must name tandem's missing libnccl.so.2")
if not summary["cuda_ops_tests"] or "cannot load" in steps["cuda_ops_tests"]:
    sys.exit(f"budget30: a missing NCCL blocked the op tests: {steps['cuda_ops_tests']!r}")
if "cannot load" not in steps["train_comparison"] or "cannot load" not in steps["check_cuda"]:
    sys.exit(f"budget30: train_comparison = {steps['train_comparison']!r}; tandem cannot load without NCCL")
PY

# The smallest budget, with nvidia-smi hanging: its step is killed at the timeout cut to the budget,
# every later step is skipped for the budget, and the files still come back in time.
STAND_IN_NVIDIA_SMI_HANGS=1 dry_run budget10 10
common_checks budget10 10
grep -q "device_facts.*timed out" "$work/budget10/out/summary.txt" ||
  fail "budget10: the hanging nvidia-smi's step is not 'timed out' (summary.txt above)"
grep -q "skipped: the budget is spent" "$work/budget10/out/summary.txt" ||
  fail "budget10: no step was skipped for the budget (summary.txt above)"

if ((failures)); then
  echo "gpu-check dry run: $failures check(s) failed" >&2
  exit 1
fi
echo "gpu-check dry run: every check held"
