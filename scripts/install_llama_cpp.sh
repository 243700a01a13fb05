#!/usr/bin/env bash
# Install llama-cpp-python (the llama.cpp engine) built for a portable x86-64 baseline.
#
# pip's default build of llama-cpp-python compiles ggml with -march=native: on an Intel
# machine that advertises AMX it compiles ggml's AMX kernels, and where the VM then traps
# the tile instructions every Q4_0 matrix product dies by SIGILL (issue 25). So the build
# names its instruction sets (scripts/llama_cpu_flags.txt: AVX2 + FMA + F16C + BMI2, no
# AVX-512, no AMX), which run on every x86-64 machine of this project (AMD, Intel with
# AVX-512, Intel with AMX). scripts/build_llama_tools.sh builds the peers with the same flags.
#
# The wheel is built once per (version, flags) into a cache folder named by their hash,
# never taken from pip's own wheel cache (which keys wheels by source, not by CMAKE_ARGS,
# and may hold a native build from before), and installed with --force-reinstall so a
# native build already in the environment is replaced.
#
# Usage: scripts/install_llama_cpp.sh PYTHON
# Environment: MULTIDRAFT_CACHE (default ~/.cache/multidraft), CMAKE_BUILD_PARALLEL_LEVEL.
set -euo pipefail
py="${1:?usage: install_llama_cpp.sh PYTHON}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
version=0.3.36
flags="$(tr -s ' \n' ' ' < "$here/llama_cpu_flags.txt" | sed 's/ *$//')"
key="$(printf '%s %s' "$version" "$flags" | sha256sum | cut -c1-12)"
dir="${MULTIDRAFT_CACHE:-$HOME/.cache/multidraft}/wheels/llama-cpp-python-$version-$key"
if ! ls "$dir"/llama_cpp_python-*.whl >/dev/null 2>&1; then
    echo "install_llama_cpp: compiling llama-cpp-python $version for the portable baseline (about 10 min on 2 cores, once)" >&2
    rm -rf "$dir.partial"
    mkdir -p "$dir.partial"
    CMAKE_ARGS="$flags" CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}" \
        "$py" -m pip wheel --quiet --no-deps --no-cache-dir --no-binary llama-cpp-python \
        "llama-cpp-python==$version" -w "$dir.partial"
    rm -rf "$dir"
    mv "$dir.partial" "$dir"
fi
"$py" -m pip install --quiet --no-deps --force-reinstall "$dir"/llama_cpp_python-*.whl
echo "install_llama_cpp: llama-cpp-python $version from $dir" >&2
