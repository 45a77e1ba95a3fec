# call 4d (after 4c, which is 4a again on a fresh machine): the gpu extra installed; llm.c built by
#   bench.peer_llmc in the background; ours d48 (this tree: no GEMM call site changed, the table being the
#   result), then llm.c d48 (bench/run_llmc_gpu.sh), both on the one GPU, one after the other
export PYTHONUNBUFFERED=1
R=/tmp/r4; mkdir -p $R; T0=$(date +%s); DEADLINE=${DEADLINE:-540}
eval "$(bash .exp/wheels.sh install /tmp/site /tmp/w1 "$(pwd)/.whl/q2" | tee /tmp/site_env.sh)"
python3 -c "import quack, flash_attn.cute, cutlass; print('gpu extra imports')" > $R/install.txt 2>&1
mkdir -p /mnt/ram && mount -t tmpfs -o size=100g tmpfs /mnt/ram
python3 -m bench.peer_llmc --source .exp/llmc --build-only > $R/llmc_build_console.txt 2>&1 &
left() { echo $(( DEADLINE - ($(date +%s) - T0) )); }
mark() { echo "$1 $(date -u +%T) rc $2 left $(left)" >> $R/times.txt; }
echo "start $(date -u +%T)" > $R/times.txt
(
  OUT=/mnt/ram/n48 TRAINERS=ours MODELS=d48 GPUS=1 STEPS=14 SKIP=6 bash bench/run_llmc_gpu.sh > $R/n48_console.txt 2>&1
  mark n48 $?; find /mnt/ram/n48 -size +50M -delete
  for _ in $(seq 150); do [ -x /tmp/llmc-build/train_gpt2cu ] && break; sleep 2; done
  OUT=/mnt/ram/l48 LLMC=.exp/llmc TRAINERS=llmc MODELS=d48 GPUS=1 STEPS=14 SKIP=6 bash bench/run_llmc_gpu.sh \
    > $R/l48_console.txt 2>&1; mark l48 $?
) &
while [ -n "$(jobs -rp)" ] && (( $(left) > 0 )); do sleep 3; done
echo "collect $(date -u +%T), jobs still running: $(jobs -rp | wc -l)" >> $R/times.txt
cp llmc_build.log $R/ 2>/dev/null
for d in /mnt/ram/*/; do
  n=$(basename "$d"); mkdir -p "$R/$n"
  (cd "$d" && find . -maxdepth 3 \( -name '*.txt' -o -name '*.json' -o -name '*.jsonl' \) -size -8M \
     | while read -r f; do mkdir -p "$R/$n/$(dirname "$f")"; cp "$f" "$R/$n/$f"; done)
done
tar czf $OUT/call4d.tgz -C $R .
cat $R/times.txt
for f in $R/*_console.txt; do echo "== $(basename $f)"; grep -E "^(d24|d48) |rror" $f | tail -n 3; done
