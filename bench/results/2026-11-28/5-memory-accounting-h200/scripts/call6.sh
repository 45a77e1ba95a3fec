# call 6: the gpu extra installed; the per-width GEMM tiles (new: this tree) against d12's tiles at every width
# (oldtiles = .exp/oldtiles: this tree with kernels/linear.py and kernels/mlp.py of the commit before), ours
# through bench.train_memory as in call 2; llm.c in the same call:
#   GPU 0: ours d48 new, then oldtiles        GPU 1: ours d48 oldtiles, then new
#   GPU 2: ours d24 new, oldtiles, new, oldtiles        GPU 3: llm.c d48, then llm.c d24
export PYTHONUNBUFFERED=1
R=/tmp/r6; mkdir -p $R; T0=$(date +%s)
eval "$(bash .exp/wheels.sh install /tmp/site /tmp/w1 "$(pwd)/.whl/2")"
python3 -c "import quack, flash_attn.cute, cutlass; print('gpu extra imports')" > $R/install.txt 2>&1
mkdir -p /mnt/ram && mount -t tmpfs -o size=150g tmpfs /mnt/ram
root=$(pwd)
python3 -m bench.peer_llmc --source .exp/llmc --build-only > $R/llmc_build_console.txt 2>&1 &
ours() {  # ours TREE MODEL NAME
  local dir=$root steps=20; [[ $1 == oldtiles ]] && dir=$root/.exp/oldtiles; [[ $2 == d48 ]] && steps=14
  (cd "$dir" && OUT=/mnt/ram/$3 TRAINERS=ours MEMORY_REPORT=1 MODELS=$2 GPUS=1 STEPS=$steps SKIP=6 \
     bash bench/run_llmc_gpu.sh > $R/${3}_console.txt 2>&1)
  echo "$3 end $(date -u +%T) rc $?" >> $R/times.txt
  find /mnt/ram/$3 -size +50M -delete
}
llmc() {  # llmc MODEL NAME
  local steps=20; [[ $1 == d48 ]] && steps=14
  for _ in $(seq 120); do [ -x /tmp/llmc-build/train_gpt2cu ] && break; sleep 2; done
  OUT=/mnt/ram/$2 LLMC=.exp/llmc TRAINERS=llmc MODELS=$1 GPUS=1 STEPS=$steps SKIP=6 bash bench/run_llmc_gpu.sh \
    > $R/${2}_console.txt 2>&1
  echo "$2 end $(date -u +%T) rc $?" >> $R/times.txt
}
echo "start $(date -u +%T)" > $R/times.txt
(export CUDA_VISIBLE_DEVICES=0; ours new d48 t48a; ours oldtiles d48 u48a) &
(export CUDA_VISIBLE_DEVICES=1; ours oldtiles d48 u48b; ours new d48 t48b) &
(export CUDA_VISIBLE_DEVICES=2; ours new d24 t24a; ours oldtiles d24 u24a; ours new d24 t24b; ours oldtiles d24 u24b) &
(export CUDA_VISIBLE_DEVICES=3; llmc d48 l48; llmc d24 l24) &
while [ -n "$(jobs -rp)" ] && (( $(date +%s) - T0 < ${DEADLINE:-420} )); do sleep 3; done
echo "collect $(date -u +%T), lanes still running: $(jobs -rp | wc -l)" >> $R/times.txt
for d in /mnt/ram/*/; do
  n=$(basename "$d"); mkdir -p "$R/$n"
  (cd "$d" && find . -maxdepth 3 \( -name '*.txt' -o -name '*.json' -o -name '*.jsonl' \) -size -8M \
     | grep -v shards | while read -r f; do mkdir -p "$R/$n/$(dirname "$f")"; cp "$f" "$R/$n/$f"; done)
done
tar czf $OUT/call6.tgz -C $R .
cat $R/times.txt
for f in $R/*_console.txt; do echo "== $(basename $f)"; grep -E "^(d24|d48) |rror" $f | tail -n 3; done
