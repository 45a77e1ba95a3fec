# call 2b (one H200, runs one after the other): the gpu extra installed; llm.c built by bench.peer_llmc;
#   ours d48 new (this tree: c_attn's and c_fc's weight gradients as their GEMM writes them), ours d48 old
#   (.exp/old: the tree of the commit before), llm.c d48 (bench/run_llmc_gpu.sh), then llm.c d48 under ncu
#   (gpu__time_duration of every kernel; one micro-step a step, 2 steps) while time is left.
export PYTHONUNBUFFERED=1
R=/tmp/r2; mkdir -p $R; T0=$(date +%s); DEADLINE=${DEADLINE:-520}
S=bench/results/2026-11-29/1-profile-llmc-ours-h200/scripts
eval "$(bash .exp/wheels.sh install /tmp/site /tmp/w1 "$(pwd)/.whl/2" | tee /tmp/site_env.sh)"
python3 -c "import quack, flash_attn.cute, cutlass; print('gpu extra imports')" > $R/install.txt 2>&1
mkdir -p /mnt/ram && mount -t tmpfs -o size=100g tmpfs /mnt/ram
python3 -m bench.peer_llmc --source .exp/llmc --build-only > $R/llmc_build_console.txt 2>&1 &
root=$(pwd)
left() { echo $(( DEADLINE - ($(date +%s) - T0) )); }
mark() { echo "$1 $(date -u +%T) rc $2 left $(left)" >> $R/times.txt; }
ours() {  # ours TREE MODEL STEPS NAME
  local dir=$root; [[ $1 == old ]] && dir=$root/.exp/old
  (cd "$dir" && OUT=/mnt/ram/$4 TRAINERS=ours MODELS=$2 GPUS=1 STEPS=$3 SKIP=6 \
     bash bench/run_llmc_gpu.sh > $R/${4}_console.txt 2>&1); mark $4 $?
  find /mnt/ram/$4 -size +50M -delete
}
llmc() {  # llmc MODEL STEPS NAME
  for _ in $(seq 150); do [ -x /tmp/llmc-build/train_gpt2cu ] && break; sleep 2; done
  OUT=/mnt/ram/$3 LLMC=.exp/llmc TRAINERS=llmc MODELS=$1 GPUS=1 STEPS=$2 SKIP=6 bash bench/run_llmc_gpu.sh \
    > $R/${3}_console.txt 2>&1; mark $3 $?
}
ncu48() {
  mkdir -p /tmp/nccl1
  timeout $(( $(left) - 15 )) ncu --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv \
    --print-units base --log-file $R/ncu_llmc_d48.csv /tmp/llmc-build/train_gpt2cu -i '/mnt/ram/n48/shards/*_train_*.bin' \
    -j '/mnt/ram/n48/shards/*_val_*.bin' -e d48 -b 16 -t 1024 -d 16384 -x 2 -r 0 -z 1 -v 1000000000 -m 1 -s 0 -h 0 \
    -n 0 -y 0 -pi fs -pf /tmp/nccl1 -pn 1 -pr 0 -pg 1 > $R/ncu_console.txt 2>&1; mark ncu48 $?
  python3 $S/kernel_table.py ncu $R/ncu_llmc_d48.csv 8 > $R/ncu_llmc_d48_kernels.txt 2>&1
}
echo "start $(date -u +%T)" > $R/times.txt
(
  ours new d48 14 n48
  ours old d48 14 o48
  llmc d48 14 l48
  (( $(left) > 100 )) && ncu48
) &
while [ -n "$(jobs -rp)" ] && (( $(left) > 0 )); do sleep 3; done
echo "collect $(date -u +%T), jobs still running: $(jobs -rp | wc -l)" >> $R/times.txt
cp llmc_build.log $R/ 2>/dev/null
for d in /mnt/ram/*/; do
  n=$(basename "$d"); mkdir -p "$R/$n"
  (cd "$d" && find . -maxdepth 3 \( -name '*.txt' -o -name '*.json' -o -name '*.jsonl' \) -size -8M \
     | while read -r f; do mkdir -p "$R/$n/$(dirname "$f")"; cp "$f" "$R/$n/$f"; done)
done
[ -f $R/ncu_llmc_d48.csv ] && gzip $R/ncu_llmc_d48.csv
tar czf $OUT/call2b.tgz -C $R .
cat $R/times.txt
for f in $R/*_console.txt; do echo "== $(basename $f)"; grep -E "^(d24|d48) |rror" $f | tail -n 3; done
head -n 40 $R/ncu_llmc_d48_kernels.txt 2>/dev/null
