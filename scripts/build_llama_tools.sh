#!/usr/bin/env bash
# Build llama.cpp's own command-line peers for the side-by-side benchmark (issue 13):
#   llama-speculative  (examples/speculative: draft-model speculative decoding, chain or tree)
#   llama-completion   (tools/completion: target-only decoding with the same sampler chain,
#                       prints its own timings)
#   llama-lookup       (examples/lookup: prompt lookup decoding, n-gram drafts copied from the
#                       prompt and the text so far, verified by the target; issue 39)
# from the llama.cpp source vendored in the llama-cpp-python sdist that the project's
# optional llama.cpp engine uses (the same llama.cpp commit as the Python binding).
#
# Idempotent: the sdist is downloaded once (sha256 checked), unpacked once, configured
# and built incrementally; a second run only prints the paths. CPU only, no network
# access from the binaries (no curl, no OpenSSL) nor from the build (llama-server's web UI is
# neither built with npm nor downloaded from Hugging Face: the server embeds an empty UI), Release, static libraries, compiled for the
# same portable x86-64 baseline as the Python binding (scripts/llama_cpu_flags.txt: AVX2, no
# AVX-512, no AMX), so the peers run on every machine the project runs on and are timed with
# the same kernels as multidraft's llama.cpp engine.
#
# Usage: scripts/build_llama_tools.sh            # prints the binaries' paths on stdout
# Environment:
#   MULTIDRAFT_LLAMA_CACHE  cache dir (default ~/.cache/multidraft/llama.cpp)
#   PYTHON                  interpreter whose pip downloads the sdist (default: .venv/bin/python
#                           if present, else python3)
#   JOBS                    parallel compile jobs (default 2)
#   LLAMA_TOOLS_TARGETS     space-separated cmake targets (default "llama-speculative llama-completion
#                           llama-lookup";
#                           add "llama-server" for benchmarks/serve_load.py: the server is then configured too)
#   MULTIDRAFT_LLAMA_PATCH_KVU  1 (default): let llama-speculative take -kvu (needed by its tree
#                           mode, see step 2b); 0: the pristine source
set -euo pipefail

VERSION=0.3.36
# the llama.cpp commit vendored in llama-cpp-python 0.3.36 (its CHANGELOG: ggml-org/llama.cpp@0c1e57098)
LLAMA_COMMIT=0c1e57098
SDIST_SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cache="${MULTIDRAFT_LLAMA_CACHE:-$HOME/.cache/multidraft/llama.cpp}"
jobs="${JOBS:-2}"
targets="${LLAMA_TOOLS_TARGETS:-llama-speculative llama-completion llama-lookup}"
if [[ -n "${PYTHON:-}" ]]; then
    py="$PYTHON"
elif [[ -x "$here/.venv/bin/python" ]]; then
    py="$here/.venv/bin/python"
else
    py=python3
fi

die() { echo "build_llama_tools: $*" >&2; exit 1; }
command -v cmake >/dev/null || die "cmake not found (apt-get install cmake)"
command -v c++ >/dev/null || die "no C++ compiler found (apt-get install g++)"

sdist="$cache/llama_cpp_python-$VERSION.tar.gz"
src="$cache/llama_cpp_python-$VERSION/vendor/llama.cpp"
build="$cache/build-$VERSION"
mkdir -p "$cache"

# 1. download (once)
if [[ ! -f "$sdist" ]]; then
    echo "build_llama_tools: downloading the llama-cpp-python $VERSION sdist into $cache" >&2
    "$py" -m pip download --quiet --no-deps --no-binary :all: \
        "llama-cpp-python==$VERSION" -d "$cache" >&2
fi
[[ -f "$sdist" ]] || die "pip did not leave $sdist"
got="$(sha256sum "$sdist" | cut -d' ' -f1)"
[[ "$got" == "$SDIST_SHA256" ]] || die "sha256 of $sdist is $got, expected $SDIST_SHA256 (delete it to download again)"

# 2. unpack (once)
if [[ ! -f "$src/examples/speculative/speculative.cpp" ]]; then
    echo "build_llama_tools: unpacking $sdist" >&2
    rm -rf "$cache/llama_cpp_python-$VERSION"
    tar -xzf "$sdist" -C "$cache"
fi
[[ -f "$src/CMakeLists.txt" ]] || die "no llama.cpp source at $src"

# 2b. the one source change (MULTIDRAFT_LLAMA_PATCH_KVU=0 to build the pristine source):
# at this commit llama-speculative does not accept -kvu/--kv-unified, and its tree mode
# (-np > 1) puts draft tokens shared by several branches into one target batch, which the
# per-sequence KV cache refuses ("sequential split is not supported when there are coupled
# sequences ... use the -kvu flag") and then aborts (GGML_ASSERT in common_sampler_sample).
# The patch only registers the existing -kvu option for the speculative example; nothing
# changes unless -kvu is passed.
arg_cpp="$src/common/arg.cpp"
arg_rel="llama_cpp_python-$VERSION/vendor/llama.cpp/common/arg.cpp"
kvu_old='.set_env("LLAMA_ARG_KV_UNIFIED").set_examples({LLAMA_EXAMPLE_SERVER,'
kvu_new='.set_env("LLAMA_ARG_KV_UNIFIED").set_examples({LLAMA_EXAMPLE_SPECULATIVE, LLAMA_EXAMPLE_SERVER,'
if [[ "${MULTIDRAFT_LLAMA_PATCH_KVU:-1}" == 1 ]]; then
    if ! grep -qF "$kvu_new" "$arg_cpp"; then
        grep -qF "$kvu_old" "$arg_cpp" || die "cannot find the -kvu option in $arg_cpp (another llama.cpp version?)"
        # basic regular expression: ( ) { } are literal, only the dot is escaped
        sed -i 's/\.set_env("LLAMA_ARG_KV_UNIFIED")\.set_examples({LLAMA_EXAMPLE_SERVER,/.set_env("LLAMA_ARG_KV_UNIFIED").set_examples({LLAMA_EXAMPLE_SPECULATIVE, LLAMA_EXAMPLE_SERVER,/' "$arg_cpp"
        grep -qF "$kvu_new" "$arg_cpp" || die "patching $arg_cpp failed"
        echo "build_llama_tools: patched $arg_cpp: llama-speculative accepts -kvu" >&2
    fi
    patched=yes
else
    if grep -qF "$kvu_new" "$arg_cpp"; then  # restore the pristine file from the sdist
        tar -xzf "$sdist" -C "$cache" "$arg_rel"
        touch "$arg_cpp"  # tar restores the archive's old mtime: make must still see a change
        echo "build_llama_tools: restored the pristine $arg_cpp" >&2
    fi
    patched=no
fi

# 2c. the statistics the benchmark reads are the examples' last log lines, and llama.cpp's logger is a
# singleton that is never deleted, so its worker thread is not drained at exit (llama.cpp issue 22142):
# on a loaded machine the last lines are lost (measured: 7 of 12 concurrent llama-lookup runs printed
# no n_predict). Both examples end main with common_log_pause(common_log_main()), which queues an end
# mark and joins the worker once every earlier line is printed. Output is otherwise unchanged.
flush='    common_log_pause(common_log_main());  // multidraft: drain the logger before exit'
for ex in speculative/speculative.cpp lookup/lookup.cpp; do
    f="$src/examples/$ex"
    grep -qF "$flush" "$f" && continue
    ln="$(grep -n '^    return 0;$' "$f" | tail -1 | cut -d: -f1)"
    [[ -n "$ln" ]] || die "no final 'return 0;' in $f (another llama.cpp version?)"
    sed -i "${ln}i\\$flush" "$f"
    grep -qF "$flush" "$f" || die "patching $f failed"
    echo "build_llama_tools: patched $f: the log is drained before exit" >&2
done

# 3. configure (cmake reruns only what changed); llama-server only when it is asked for
server=OFF
[[ " $targets " == *" llama-server "* ]] && server=ON
# (read -d '' reads the whole file and returns 1 at its end, which set -e must not see)
read -r -d '' -a cpu_flags < "$here/scripts/llama_cpu_flags.txt" || true
[[ ${#cpu_flags[@]} -gt 0 ]] || die "no flags read from scripts/llama_cpu_flags.txt"
cmake -S "$src" -B "$build" -DCMAKE_BUILD_TYPE=Release \
    -DBUILD_SHARED_LIBS=OFF \
    -DLLAMA_BUILD_COMMON=ON -DLLAMA_BUILD_EXAMPLES=ON -DLLAMA_BUILD_TOOLS=ON \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER="$server" -DLLAMA_BUILD_APP=OFF \
    -DLLAMA_OPENSSL=OFF -DLLAMA_LLGUIDANCE=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
    -DGGML_CUDA=OFF -DGGML_METAL=OFF -DGGML_VULKAN=OFF -DGGML_RPC=OFF \
    "${cpu_flags[@]}" \
    -DLLAMA_BUILD_COMMIT="$LLAMA_COMMIT" -DLLAMA_BUILD_NUMBER=0 >&2

# 4. build only the peers
t0=$(date +%s)
# shellcheck disable=SC2086
cmake --build "$build" --config Release -j "$jobs" --target $targets >&2
t1=$(date +%s)
echo "build_llama_tools: llama.cpp $LLAMA_COMMIT (llama-cpp-python $VERSION), -kvu patch: $patched;" \
     "build step took $((t1 - t0)) s with -j $jobs (an up-to-date tree takes ~0 s)" >&2

for t in $targets; do
    bin="$build/bin/$t"
    [[ -x "$bin" ]] || die "target $t built but $bin is missing"
    echo "$bin"
done
