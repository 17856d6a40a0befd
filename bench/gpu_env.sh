# Sourced by the GPU scripts: puts the machine's CUDA libraries on the
# library path, and ours (BIN_DIR/libs, from bench/pack_gpu.sh) only for the
# names the machine lacks.   Needs: $bin (binary folder), $work (scratch).
# Also their two helpers: `say` prints a heading to the screen and to $log,
# `has STEP` tells whether $steps asks for STEP.
say() { echo "== $*" | tee -a "$log"; }
has() { [[ " ${steps:-} " == *" $1 "* ]]; }
# `start_run_log`: $out/run.log afresh and status=0, the card on its first lines.
start_run_log() {
  mkdir -p "$out" "$work"
  log="$out/run.log"
  : > "$log"
  status=0
  nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv | tee -a "$log"
}
mkdir -p "$work/libs"
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
         $(python3 -c 'import nvidia, os; print(" ".join(os.path.join(p, q, "lib") for p in nvidia.__path__ for q in os.listdir(p)))' 2>/dev/null); do
  if [ -e "$d/libcublas.so.13" ]; then export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"; break; fi
done
for lib in $(ldd "$bin/baton" "$bin"/tests/* $(ls "$bin"/bench/* 2>/dev/null) 2>/dev/null | awk '/not found/ {print $1}' | sort -u); do
  [ -e "$bin/libs/$lib" ] && ln -sf "$(cd "$bin/libs" && pwd)/$lib" "$work/libs/$lib"
done
export LD_LIBRARY_PATH="$work/libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# NVLink multicast stays off wherever NCCL may start.
export NCCL_NVLS_ENABLE=0
