#!/usr/bin/env bash
# The Spark's own CPU: cross-builds the host code for aarch64 (CUDA off, no
# sanitizers, Release without debug info) and runs under qemu-user the CPU
# suites where char signedness, alignment and long's size could break things
# silently: tokenizers, Jinja and chat templates, grammars, GGUF, quant
# blocks, the sampler, and the llama and deepseek4 CPU exactness against their
# references. docs/AARCH64.md lists them and how to run one by hand.
# Skips (exit 0, with a message) only where the packages cannot be installed.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(uname -m)" = aarch64 ]; then echo "=== aarch64: this machine is aarch64, the native suites ran on it"; exit 0; fi
rc=0
bash scripts/deps_aarch64.sh || rc=$?
if [ "$rc" -eq 3 ]; then echo "=== aarch64: SKIPPED (the cross compiler and arm64 packages cannot be installed here)"; exit 0; fi
[ "$rc" -eq 0 ] || exit "$rc"
jobs=$(( $(nproc) < 2 ? $(nproc) : 2 ))
build=${BATON_AARCH64_BUILD:-build-aarch64}
suites=(test_engine_tokenizer test_chat_jinja test_chat_template test_chat_builtin_templates
        test_engine_grammar test_engine_gguf test_kernels_quant test_engine_sampler
        test_engine_llama test_engine_deepseek4)
cmake -S . -B "$build" -G Ninja -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake \
      -DCMAKE_BUILD_TYPE=Release -DBATON_CUDA=OFF -DBATON_SANITIZE= -DBATON_TESTS=ON >/dev/null
cmake --build "$build" -j "$jobs" --target "${suites[@]}"
failed=()
for t in "${suites[@]}"; do
  echo "=== aarch64 $t"
  # A hang under the emulator fails the suite instead of stalling CI.
  if ! timeout 600 qemu-aarch64 -L / "$build/tests/$t" --gtest_brief=1; then failed+=("$t"); fi
done
if ((${#failed[@]})); then echo "aarch64 FAILED suites: ${failed[*]}"; exit 1; fi
echo "aarch64: all ${#suites[@]} suites passed under qemu"
