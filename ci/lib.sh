# Shared by ci/demo, ci/test and ci/gpu-check: install what is missing, configure, build.
# Sourced, not run. Idempotent: a set-up machine spends seconds here.

TANDEM_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TANDEM_PACKAGES=(cmake make g++ ccache pkg-config python3
  libpcre2-dev  # byte-level BPE's pre-tokenizer regexes (core/data/byte_level_bpe.*)
  libsentencepiece-dev  # SentencePieceTokenizer / Llama2Tokenizer .model files (core/data/sentencepiece_model.*)
  nlohmann-json3-dev libboost-dev librapidcheck-dev
  libboost-context-dev  # cuda-sim's fibers (cuda_sim/engine.cpp)
  libgtest-dev libgmock-dev libcli11-dev
  libopenmpi-dev openmpi-bin gnuplot-nox
  python3-venv python3-numpy python3-torch  # tests/megatron: megatron-core 0.16.1 from PyPI needs them
  slurm-wlm munge  # tests/slurm: a private one-node Slurm cluster (srun --mpi=pmix, sbatch --requeue)
  clang libclang-rt-14-dev)  # tests/fuzz: clang 14's libFuzzer, ASan and UBSan (ci/test's fuzz pass)

tandem_log() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

# Installs the Debian packages tandem builds with, when any is missing.
tandem_install_packages() {
  local missing=()
  for package in "${TANDEM_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "ok installed" ||
      missing+=("$package")
  done
  if ((${#missing[@]})); then
    tandem_log "installing: ${missing[*]}"
    local sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
      "${missing[@]}" >/dev/null
  fi
  if ! command -v nvcc >/dev/null 2>&1 && [ ! -x /usr/local/cuda/bin/nvcc ]; then
    echo "error: nvcc not found: tandem compiles its CUDA sources in every build" >&2
    echo "fix: install the CUDA Toolkit under /usr/local/cuda" >&2
    return 1
  fi
}

# OpenMPI refuses root unless told; CI and the demo machines run as root.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

# tandem_build DIR [cmake args...]: configure once, then build everything in DIR.
tandem_build() {
  local dir="$1"
  shift
  local jobs
  jobs="$(nproc)"
  mkdir -p "$dir"
  if [ ! -f "$dir/CMakeCache.txt" ]; then
    tandem_log "configuring $dir"
    cmake -S "$TANDEM_ROOT" -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@" >"$dir/tandem-configure.log" 2>&1 ||
      { cat "$dir/tandem-configure.log" >&2; return 1; }
  fi
  tandem_log "building $dir with $jobs jobs (log: $dir/tandem-build.log)"
  if ! cmake --build "$dir" -j "$jobs" >"$dir/tandem-build.log" 2>&1; then
    grep -E -A5 "error" "$dir/tandem-build.log" | head -60 >&2
    echo "error: the build failed; the whole log is $dir/tandem-build.log" >&2
    return 1
  fi
}
