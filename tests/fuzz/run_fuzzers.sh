#!/usr/bin/env bash
# Runs every libFuzzer target of a fuzz build (-DTANDEM_FUZZ=ON) for SECONDS each, starting from
# its seed corpus fixtures/fuzz/<target>/ (read, never written: new inputs go to a scratch
# folder). Exits non-zero at the first finding (a crash, a sanitizer report, a timeout of one
# input, a leak, an out-of-memory), printing the fuzzer's report and the path of the input, which
# it copies to FINDINGS_DIR (default: fuzz-findings/ under the build).
# Usage: tests/fuzz/run_fuzzers.sh BUILD_DIR [SECONDS_EACH=20] [TARGET...]
#   a longer run of one target: tests/fuzz/run_fuzzers.sh build-fuzz 3600 manifest
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
build="$(cd "$1" && pwd)"
seconds="${2:-20}"
shift $(($# >= 2 ? 2 : 1))
targets=("$@")
((${#targets[@]})) || targets=(indexed_dataset safetensors manifest config arguments)
findings="${FINDINGS_DIR:-$build/fuzz-findings}"
mkdir -p "$findings"
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT

for target in "${targets[@]}"; do
  fuzzer="$build/tests/fuzz/fuzz_$target"
  seeds="$root/fixtures/fuzz/$target"
  [ -x "$fuzzer" ] || { echo "error: $fuzzer is not built (cmake --build $build)" >&2; exit 1; }
  [ -d "$seeds" ] || { echo "error: no seed corpus $seeds (tests/fuzz/make_seed_corpus.sh)" >&2; exit 1; }
  mkdir -p "$scratch/$target"
  # -timeout: one input taking 10 s is a hang; -rss_limit_mb: one input taking 2 GiB is a finding.
  # Leak detection is on (libFuzzer's -detect_leaks=1 is its default with ASan).
  if "$fuzzer" "$scratch/$target" "$seeds" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
    -artifact_prefix="$findings/$target-" -print_final_stats=1 >"$scratch/$target.log" 2>&1; then
    runs="$(grep -m1 -o 'stat::number_of_executed_units: *[0-9]*' "$scratch/$target.log" | grep -o '[0-9]*$' || echo '?')"
    echo "fuzz_$target: $runs inputs in ${seconds} s, no finding"
  else
    tail -n 60 "$scratch/$target.log" >&2
    echo "error: fuzz_$target found an input that crashes, hangs, leaks or trips a sanitizer;" \
         "it is in $findings (reproduce: $fuzzer FILE)" >&2
    exit 1
  fi
done
