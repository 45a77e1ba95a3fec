# call 4: the gpu extra installed; four lanes, one a GPU:
#   GPU 0: quack's plain GEMM at each call site and candidate tile at d48's shapes (bench_kernels --only linear-gemm),
#          then the same at d12's
#   GPU 1: the same at d24's shapes
#   GPU 2: quack's MLP GEMMs (GELU epilogue, dGELU) at each candidate tile at d48's shapes (--only mlp-gemm)
#   GPU 3: ours d48 old code, then new code (the rounding lever again, the order of call 2 reversed)
export PYTHONUNBUFFERED=1
R=/tmp/r4; mkdir -p $R; T0=$(date +%s)
eval "$(bash .exp/wheels.sh install /tmp/site /tmp/w1 "$(pwd)/.whl/2")"
python3 -c "import quack, flash_attn.cute, cutlass; print('gpu extra imports')" > $R/install.txt 2>&1
mkdir -p /mnt/ram && mount -t tmpfs -o size=100g tmpfs /mnt/ram
root=$(pwd)
ours() {  # ours TREE MODEL NAME
  local dir=$root; [[ $1 == old ]] && dir=$root/.exp/old
  (cd "$dir" && OUT=/mnt/ram/$3 TRAINERS=ours MEMORY_REPORT=1 MODELS=$2 GPUS=1 STEPS=14 SKIP=6 \
     bash bench/run_llmc_gpu.sh > $R/${3}_console.txt 2>&1)
  echo "$3 end $(date -u +%T) rc $?" >> $R/times.txt
  find /mnt/ram/$3 -size +50M -delete
}
kb() {  # kb NAME MODEL B BENCH
  python3 -m bench.bench_kernels --model $2 --batch-size $3 --only $4 --json $R/$1.json > $R/$1.txt 2>&1
  echo "$1 end $(date -u +%T) rc $?" >> $R/times.txt
}
echo "start $(date -u +%T)" > $R/times.txt
(export CUDA_VISIBLE_DEVICES=0; kb lin_d48 d48 16 linear-gemm; kb lin_d12 d12 64 linear-gemm) &
(export CUDA_VISIBLE_DEVICES=1; kb lin_d24 d24 32 linear-gemm) &
(export CUDA_VISIBLE_DEVICES=2; kb mlp_d48 d48 16 mlp-gemm) &
(export CUDA_VISIBLE_DEVICES=3; ours old d48 o48r; ours new d48 n48r) &
while [ -n "$(jobs -rp)" ] && (( $(date +%s) - T0 < ${DEADLINE:-540} )); do sleep 3; done
echo "collect $(date -u +%T), lanes still running: $(jobs -rp | wc -l)" >> $R/times.txt
for d in /mnt/ram/*/; do
  n=$(basename "$d"); mkdir -p "$R/$n"
  (cd "$d" && find . -maxdepth 3 \( -name '*.txt' -o -name '*.json' -o -name '*.jsonl' \) -size -8M \
     | grep -v shards | while read -r f; do mkdir -p "$R/$n/$(dirname "$f")"; cp "$f" "$R/$n/$f"; done)
done
tar czf $OUT/call4.tgz -C $R .
cat $R/times.txt
for f in $R/o48r_console.txt $R/n48r_console.txt; do grep -E "^d48 " $f; done
for f in $R/lin_*.txt $R/mlp_*.txt; do echo "== $f"; grep -E "pinned|cuBLAS" $f | head -12; done
