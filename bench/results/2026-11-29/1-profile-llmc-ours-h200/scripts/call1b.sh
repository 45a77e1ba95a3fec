# call 1b (one H200, runs one after the other): the gpu extra installed; llm.c built by bench.peer_llmc;
#   ours d48 (bench/run_llmc_gpu.sh, TRAINERS=ours), llm.c d48 (TRAINERS=llmc), bench.profile_train at d48
#   (12 steps, 3 profiled), llm.c d48 under ncu (gpu__time_duration of every kernel; one micro-step a step,
#   3 steps), then ours and llm.c at d24 while time is left.
export PYTHONUNBUFFERED=1
R=/tmp/r1; mkdir -p $R; T0=$(date +%s); DEADLINE=${DEADLINE:-545}
S=bench/results/2026-11-29/1-profile-llmc-ours-h200/scripts
eval "$(bash .exp/wheels.sh install /tmp/site /tmp/w1 "$(pwd)/.whl/2")"
python3 -c "import quack, flash_attn.cute, cutlass; print('gpu extra imports')" > $R/install.txt 2>&1
mkdir -p /mnt/ram && mount -t tmpfs -o size=100g tmpfs /mnt/ram
python3 -m bench.peer_llmc --source .exp/llmc --build-only > $R/llmc_build_console.txt 2>&1 &
left() { echo $(( DEADLINE - ($(date +%s) - T0) )); }
mark() { echo "$1 $(date -u +%T) rc $2 left $(left)" >> $R/times.txt; }
ours() {  # ours MODEL STEPS NAME
  OUT=/mnt/ram/$3 TRAINERS=ours MODELS=$1 GPUS=1 STEPS=$2 SKIP=6 \
    bash bench/run_llmc_gpu.sh > $R/${3}_console.txt 2>&1; mark $3 $?
  find /mnt/ram/$3 -size +50M -delete
}
llmc() {  # llmc MODEL STEPS NAME
  for _ in $(seq 150); do [ -x /tmp/llmc-build/train_gpt2cu ] && break; sleep 2; done
  OUT=/mnt/ram/$3 LLMC=.exp/llmc TRAINERS=llmc MODELS=$1 GPUS=1 STEPS=$2 SKIP=6 \
    bash bench/run_llmc_gpu.sh > $R/${3}_console.txt 2>&1; mark $3 $?
}
profile48() {
  mkdir -p /mnt/ram/p48
  python3 -m bench.profile_train --profile-steps 8 3 --out /mnt/ram/p48/profile.json -- --model d48 --batch-size 16 \
    --seq-len 1024 --total-batch-size 131072 --max-steps 12 --warmup-steps 3 --train-data '/mnt/ram/o48/shards/*_train_*.bin' \
    --val-data '/mnt/ram/o48/shards/*_val_*.bin' --val-every 0 --hellaswag-every 0 --sample-every 0 --checkpoint-every 0 \
    --log-every 1 --out-dir /mnt/ram/p48/run --no-resume --keep-mlp-post-gb 0 > $R/p48_console.txt 2>&1; mark p48 $?
  cp /mnt/ram/p48/profile.json $R/p48_profile.json
  python3 $S/kernel_table.py torch /mnt/ram/p48/profile.trace.json.gz 3 > $R/p48_kernels.txt 2>&1
  find /mnt/ram/p48 -size +50M -delete
}
ncu48() {
  mkdir -p /tmp/nccl1
  timeout 170 ncu --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv --print-units base \
    --log-file $R/ncu_llmc_d48.csv /tmp/llmc-build/train_gpt2cu -i '/mnt/ram/o48/shards/*_train_*.bin' \
    -j '/mnt/ram/o48/shards/*_val_*.bin' -e d48 -b 16 -t 1024 -d 16384 -x 3 -r 0 -z 1 -v 1000000000 -m 1 -s 0 -h 0 -n 0 \
    -y 0 -pi fs -pf /tmp/nccl1 -pn 1 -pr 0 -pg 1 > $R/ncu_console.txt 2>&1; mark ncu48 $?
  python3 $S/kernel_table.py ncu $R/ncu_llmc_d48.csv 8 > $R/ncu_llmc_d48_kernels.txt 2>&1
}
echo "start $(date -u +%T)" > $R/times.txt
(
  ours d48 14 o48
  llmc d48 14 l48
  profile48
  (( $(left) > 200 )) && ncu48
  (( $(left) > 130 )) && ours d24 20 o24
  (( $(left) > 70 )) && llmc d24 20 l24
) &
while [ -n "$(jobs -rp)" ] && (( $(left) > 0 )); do sleep 3; done
echo "collect $(date -u +%T), jobs still running: $(jobs -rp | wc -l)" >> $R/times.txt
cp llmc_build.log $R/ 2>/dev/null
for d in /mnt/ram/*/; do
  n=$(basename "$d"); [ "$n" = shards ] && continue; mkdir -p "$R/$n"
  (cd "$d" && find . -maxdepth 3 \( -name '*.txt' -o -name '*.json' -o -name '*.jsonl' \) -size -8M \
     | while read -r f; do mkdir -p "$R/$n/$(dirname "$f")"; cp "$f" "$R/$n/$f"; done)
done
gzip -k $R/ncu_llmc_d48.csv 2>/dev/null; rm -f $R/ncu_llmc_d48.csv
tar czf $OUT/call1b.tgz -C $R .
cat $R/times.txt
for f in $R/*_console.txt; do echo "== $(basename $f)"; grep -E "^(d24|d48) |rror|gpt2.train / llm.c" $f | tail -n 4; done
head -n 14 $R/p48_kernels.txt; head -n 14 $R/ncu_llmc_d48_kernels.txt
