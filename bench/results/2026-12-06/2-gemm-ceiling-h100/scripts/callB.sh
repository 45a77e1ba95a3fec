# call B (right after A, warm; carries .whl/r/2): the gpu extra installed; ours at d48 (B=16, 131,072 tokens a step,
#   `--keep-mlp-post-gb 0`) as bench/run_llmc_gpu.sh runs it, stopped after its 14th step (stop_after_steps.sh); then
#   the same flags under bench.profile_train, steps 8-10 profiled, for the GEMMs' time inside the real step.
export PYTHONUNBUFFERED=1
R=$OUT; T0=$(date +%s); DEADLINE=${DEADLINE:-570}
left() { echo $(( DEADLINE - ($(date +%s) - T0) )); }
mark() { echo "$1 $(date -u +%T) rc $2 left $(left)" >> $R/times.txt; }
echo "start $(date -u +%T) $(nvidia-smi --query-gpu=name,uuid --format=csv,noheader)" > $R/times.txt
eval "$(bash /tmp/wheels.sh install /tmp/site /tmp/w1 "$(pwd)/.whl/r/2" | tee /tmp/site_env.sh)"
python3 -c "import quack, flash_attn.cute, cutlass; print('gpu extra imports')" >> $R/times.txt 2>&1; mark install $?
S=bench/results/2026-12-06/2-gemm-ceiling-h100/scripts
export TORCHINDUCTOR_CACHE_DIR=/tmp/inductor-s
PYTHON=$(pwd)/$S/stop_after_steps.sh SHARDS=/mnt/ram/shards OUT=/mnt/ram/b TRAINERS=ours MODELS=d48 GPUS=1 STEPS=14 \
  SKIP=6 timeout $(( $(left) - 200 )) bash bench/run_llmc_gpu.sh > $R/o48_console.txt 2>&1; mark o48 $?
timeout $(( $(left) - 10 )) python3 -m bench.profile_train --profile-steps 8 3 --out /mnt/ram/prof48.json -- \
  --model d48 --batch-size 16 --seq-len 1024 --total-batch-size 131072 --max-steps 11 --warmup-steps 3 \
  --train-data "/mnt/ram/shards/*_train_*.bin" --val-data "/mnt/ram/shards/*_val_*.bin" --val-every 0 \
  --hellaswag-every 0 --sample-every 0 --checkpoint-every 0 --log-every 5 --out-dir /mnt/ram/p48 --no-resume \
  --keep-mlp-post-gb 0 > $R/prof48_console.txt 2>&1; mark prof48 $?
cp /mnt/ram/prof48.json /mnt/ram/prof48.trace.json.gz $R/ 2>/dev/null
cp /mnt/ram/b/summary.json $R/o48_summary.json 2>/dev/null
cat $R/times.txt; grep -E "^d48 |rror" $R/o48_console.txt | tail -5; tail -n 25 $R/prof48_console.txt
