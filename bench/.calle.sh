set -u
B=build-cuda/gpu; bin=$B; work=/tmp/w; mkdir -p $work $OUT/e; source bench/gpu_env.sh
for t in test_cuda_stage test_cuda_matvec test_cuda_moe test_cuda_ds4_stage test_cuda_ds4_prefill; do echo "$t: $(timeout 150 $B/tests/$t --gtest_brief=1 2>&1 | grep -E '^\[  (PASSED|FAILED)|Failure' | head -5 | tr '\n' ' ')"; done
for ty in q4_k q8_0; do
  $B/baton synth --shape llama-8b --type $ty --data alias -q -o $work/l8-$ty.gguf 2>&1 | tail -n 1
  timeout 60 $B/baton bench -m $work/l8-$ty.gguf --backend cuda --load-only --load-csv $OUT/loadonly_l8_$ty.csv 2> $work/b.err > /dev/null; tr '\r' '\n' < $work/b.err | grep -E "loaded|host RSS"
  timeout 100 $B/baton bench -m $work/l8-$ty.gguf --backend cuda --csv --ctx-start 512 --ctx-max 512 --gen-tokens 128 --batch 512 > $OUT/bench_l8_$ty.csv 2> $work/b.err; tr '\r' '\n' < $work/b.err | grep -E "loaded|ctx  |host RSS"
  rm -f $work/l8-$ty.gguf
done
bash bench/ds4_gpu_check.sh $B $OUT/e /mnt/ram "q4" > /dev/null 2>&1; grep -E "loaded|host RSS|split in" $OUT/e/run.log
