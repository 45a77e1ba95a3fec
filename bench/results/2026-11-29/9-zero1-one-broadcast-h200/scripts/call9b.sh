# call 9b (right after 9a, warm): the gpu extra installed; d48 at B=16, T=1024 (131,072 tokens a step), --zero1, one
#   run after the other: this tree (`one`: each rank's parameters in one bucket, one broadcast a rank) on 1 then 2
#   GPUs, then the code before (.exp/b0, a6971c6: one broadcast per parameter tensor) on 2 GPUs; the model's code is
#   the same in both trees, so they share one Inductor cache. Then d24 (B=32) the same way while time is left.
#   Runs are stopped once their last step is logged (folder 8's stop_after_steps.sh: the final checkpoint is no
#   part of the timed steps).
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
R=/tmp/r9b; mkdir -p $R; T0=$(date +%s); DEADLINE=${DEADLINE:-565}
left() { echo $(( DEADLINE - ($(date +%s) - T0) )); }
mark() { echo "$1 $(date -u +%T) rc $2 left $(left)" >> $R/times.txt; }
echo "start $(date -u +%T)" > $R/times.txt
eval "$(bash .exp/wheels.sh install /tmp/site /tmp/w1 "$(pwd)/.whl/r/2")"
python3 -c "import quack, flash_attn.cute, cutlass; print('gpu extra imports; quack', quack.__version__)" > $R/install.txt 2>&1; mark install $?
root=$(pwd); STOP=$root/bench/results/2026-11-29/8-two-gpus-d48-h200/scripts/stop_after_steps.sh
bench() {  # bench NAME TREE MODEL GPU-COUNTS
  (cd "$root/$2" && TORCHINDUCTOR_CACHE_DIR=/tmp/inductor-9 PYTHON=$STOP SHARDS=/mnt/ram/shards OUT=/mnt/ram/$1 \
     TRAINERS=ours MODELS=$3 GPUS="$4" STEPS=14 SKIP=6 timeout $(( $(left) - 8 )) \
     bash bench/run_llmc_gpu.sh --zero1 > $R/${1}_console.txt 2>&1); mark $1 $?
}
bench one48 . d48 "1 2"
bench before48 .exp/b0 d48 "2"
(( $(left) > 200 )) && bench one24 . d24 "1 2"
(( $(left) > 90 )) && bench before24 .exp/b0 d24 "2"
echo "collect $(date -u +%T)" >> $R/times.txt
for d in /mnt/ram/*/; do
  n=$(basename "$d"); [ "$n" = shards ] && continue; mkdir -p "$R/$n"
  (cd "$d" && find . -maxdepth 3 \( -name '*.txt' -o -name '*.json' -o -name '*.jsonl' \) -size -8M \
     | while read -r f; do mkdir -p "$R/$n/$(dirname "$f")"; cp "$f" "$R/$n/$f"; done)
done
tar czf $OUT/call9b.tgz -C $R .
cat $R/times.txt
for f in $R/*_console.txt; do echo "== $(basename $f)"; grep -E "^(d24|d48) |rror" $f | tail -n 4; done
