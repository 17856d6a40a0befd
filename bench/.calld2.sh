set -u
B=build-cuda/gpu; bin=$B; work=/tmp/w; mkdir -p $work $OUT/d2; source bench/gpu_env.sh
bash bench/ds4_gpu_check.sh $B $OUT/d2 /mnt/ram "oracle q4" > /dev/null 2>&1; grep -v "^baton net" $OUT/d2/run.log | tail -n 45
for ty in q4_k q8_0; do
  $B/baton synth --shape llama-8b --type $ty --data alias -q -o $work/l8-$ty.gguf 2>&1 | tail -n 1
  timeout 150 $B/baton bench -m $work/l8-$ty.gguf --backend cuda --csv --ctx-start 512 --ctx-max 4096 --step-mul 2 --gen-tokens 128 --batch 512 --load-csv $OUT/load_l8_$ty.csv > $OUT/bench_l8_$ty.csv 2> $work/b.err; tr '\r' '\n' < $work/b.err | grep -E "loaded|ctx|ceilings|host RSS"
  timeout 60 $B/baton bench -m $work/l8-$ty.gguf --backend cuda --load-only --load-csv $OUT/loadonly_l8_$ty.csv 2> $work/b.err > /dev/null; tr '\r' '\n' < $work/b.err | grep -E "loaded|host RSS"
done
