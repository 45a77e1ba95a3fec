# call 7b (right after 7a, warm): the gpu extra installed; llm.c built (bench.peer_llmc); d48 at B=16, T=1024, one after
#   the other on the one GPU, each tree with its own Inductor cache: ours `before` (.exp/b0: 78bab18's code), ours
#   `gemm` (this tree: attn.c_proj's and mlp.c_proj's weight gradients added into the flat buffer by their GEMMs),
#   then llm.c
export PYTHONUNBUFFERED=1
R=/tmp/r7b; mkdir -p $R; T0=$(date +%s); DEADLINE=${DEADLINE:-575}
eval "$(bash .exp/wheels.sh install /tmp/site /tmp/w1 "$(pwd)/.whl/r/2" | tee /tmp/site_env.sh)"
python3 -c "import quack, flash_attn.cute, cutlass; print('gpu extra imports; quack', quack.__version__)" > $R/install.txt 2>&1
mkdir -p /mnt/ram && mount -t tmpfs -o size=100g tmpfs /mnt/ram
python3 -m bench.peer_llmc --source .exp/llmc --build-only > $R/llmc_build_console.txt 2>&1 &
root=$(pwd)
left() { echo $(( DEADLINE - ($(date +%s) - T0) )); }
mark() { echo "$1 $(date -u +%T) rc $2 left $(left)" >> $R/times.txt; }
ours() {  # ours TREE NAME MODEL
  (cd "$root/$1" && TORCHINDUCTOR_CACHE_DIR=/tmp/inductor-$2 SHARDS=/mnt/ram/shards OUT=/mnt/ram/$2 TRAINERS=ours \
     MODELS=$3 GPUS=1 STEPS=14 SKIP=6 bash bench/run_llmc_gpu.sh > $R/${2}_console.txt 2>&1); mark $2 $?
  find /mnt/ram/$2 -size +50M -delete
}
llmc() {  # llmc NAME MODEL
  for _ in $(seq 150); do [ -x /tmp/llmc-build/train_gpt2cu ] && break; sleep 2; done
  OUT=/mnt/ram/$1 SHARDS=/mnt/ram/shards LLMC=.exp/llmc TRAINERS=llmc MODELS=$2 GPUS=1 STEPS=14 SKIP=6 \
    bash bench/run_llmc_gpu.sh > $R/${1}_console.txt 2>&1; mark $1 $?
}
echo "start $(date -u +%T)" > $R/times.txt
( ours .exp/b0 before d48; ours . gemm d48; llmc l48 d48 ) &
while [ -n "$(jobs -rp)" ] && (( $(left) > 0 )); do sleep 3; done
echo "collect $(date -u +%T), jobs still running: $(jobs -rp | wc -l)" >> $R/times.txt
cp /tmp/llmc-build/llmc_build.log llmc_build.log $R/ 2>/dev/null
for d in /mnt/ram/*/; do
  n=$(basename "$d"); [ "$n" = shards ] && continue; mkdir -p "$R/$n"
  (cd "$d" && find . -maxdepth 3 \( -name '*.txt' -o -name '*.json' -o -name '*.jsonl' \) -size -8M \
     | while read -r f; do mkdir -p "$R/$n/$(dirname "$f")"; cp "$f" "$R/$n/$f"; done)
done
tar czf $OUT/call7b.tgz -C $R .
cat $R/times.txt
for f in $R/*_console.txt; do echo "== $(basename $f)"; grep -E "^(d24|d48) |rror" $f | tail -n 3; done
