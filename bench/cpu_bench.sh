#!/usr/bin/env bash
# The cpu backend's figures as docs/PERFORMANCE.md reports them (issue 28): installs OpenBLAS when
# missing (Debian's libopenblas-dev: the GEMM ceiling, and the BLAS Debian's torch then loads),
# configures and builds host_backend_bench in BUILD_DIR (default build/, the README's build type),
# then runs it pinned to one core and, for the threads' scaling, on two, with PyTorch beside it.
#
#   bench/cpu_bench.sh [BUILD_DIR] [-- extra cmake arguments, e.g. -DCMAKE_BUILD_TYPE=Release]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:-$root/build}"
shift || true
[ "${1:-}" = "--" ] && shift
if ! dpkg -s libopenblas-dev >/dev/null 2>&1; then
  echo "installing libopenblas-dev (OpenBLAS: the GEMM ceiling, and torch's BLAS)" >&2
  ${SUDO:-$([ "$(id -u)" = 0 ] || echo sudo)} apt-get install -y libopenblas-dev >/dev/null
fi
cmake -S "$root" -B "$build" "$@" >/dev/null
cmake --build "$build" -j "$(nproc)" --target host_backend_bench >/dev/null
# One core for the single-thread columns, two (where there are two) for the threads' columns.
cores="0"
[ "$(nproc)" -ge 2 ] && cores="0,1"
taskset -c 0 "$build/bench/host_backend_bench" gemm
taskset -c "$cores" "$build/bench/host_backend_bench" train --iterations 3 --threads 2 --pytorch
