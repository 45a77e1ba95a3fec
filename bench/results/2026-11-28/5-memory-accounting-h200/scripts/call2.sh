# call 2: the gpu extra installed; four lanes, one a GPU, each run one after the other on its GPU:
#   GPU 0: ours d48 (new code), llm.c d48, ours d48 (old code)          -- the speed ratio and the rounding lever
#   GPU 1: ours d24 new, old, new, old, then llm.c d24
#   GPU 2: ours d12 new, old, then new with PyTorch's allocator as it comes (expandable segments off)
#   GPU 3: ours d24 and d48, new code, expandable segments off
# every run of ours through bench.train_memory (MEMORY_REPORT=1: the accounting in run_*.memory.json), nvidia-smi
# read every 0.2 s on the run's own GPU. old = .exp/old: this tree with gpt2/optim.py and
# kernels/stochastic_round.py of the commit before (the rounding through a cached piece).
export PYTHONUNBUFFERED=1
R=/tmp/r2; mkdir -p $R; T0=$(date +%s)
eval "$(bash .exp/wheels.sh install /tmp/site /tmp/w1 "$(pwd)/.whl/2")"
{ echo "PYTHONPATH=$PYTHONPATH"; ls /tmp/site | grep dist-info
  python3 -c "import quack, flash_attn.cute, cutlass; print('gpu extra imports')"; } > $R/install.txt 2>&1
mkdir -p /mnt/ram && mount -t tmpfs -o size=200g tmpfs /mnt/ram
nvidia-smi --query-gpu=index,memory.used,memory.reserved --format=csv > $R/smi_idle.txt
root=$(pwd)
python3 -m bench.peer_llmc --source .exp/llmc --build-only > $R/llmc_build_console.txt 2>&1 &
ours() {  # ours TREE MODEL NAME [VAR=value...]
  local tree=$1 model=$2 name=$3; shift 3
  local dir=$root steps=20; [[ $tree == old ]] && dir=$root/.exp/old; [[ $model == d48 ]] && steps=14
  (cd "$dir" && env "$@" OUT=/mnt/ram/$name TRAINERS=ours MEMORY_REPORT=1 MODELS=$model GPUS=1 STEPS=$steps SKIP=6 \
     bash bench/run_llmc_gpu.sh > $R/${name}_console.txt 2>&1)
  echo "$name end $(date -u +%T) rc $?" >> $R/times.txt
  find /mnt/ram/$name -size +50M -delete
}
llmc() {  # llmc MODEL NAME
  local steps=20; [[ $1 == d48 ]] && steps=14
  for _ in $(seq 120); do [ -x /tmp/llmc-build/train_gpt2cu ] && break; sleep 2; done
  OUT=/mnt/ram/$2 LLMC=.exp/llmc TRAINERS=llmc MODELS=$1 GPUS=1 STEPS=$steps SKIP=6 bash bench/run_llmc_gpu.sh \
    > $R/${2}_console.txt 2>&1
  echo "$2 end $(date -u +%T) rc $?" >> $R/times.txt
}
echo "start $(date -u +%T)" > $R/times.txt
(export CUDA_VISIBLE_DEVICES=0; ours new d48 n48; llmc d48 l48; ours old d48 o48) &
(export CUDA_VISIBLE_DEVICES=1; ours new d24 n24a; ours old d24 o24a; ours new d24 n24b; ours old d24 o24b; llmc d24 l24) &
(export CUDA_VISIBLE_DEVICES=2; ours new d12 n12; ours old d12 o12; ours new d12 x12 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:False) &
(export CUDA_VISIBLE_DEVICES=3; ours new d24 x24 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:False
 ours new d48 x48 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:False) &
while [ -n "$(jobs -rp)" ] && (( $(date +%s) - T0 < ${DEADLINE:-545} )); do sleep 3; done
echo "collect $(date -u +%T), lanes still running: $(jobs -rp | wc -l)" >> $R/times.txt
for d in /mnt/ram/*/; do
  n=$(basename "$d"); mkdir -p "$R/$n"
  (cd "$d" && find . -maxdepth 3 \( -name '*.txt' -o -name '*.json' -o -name '*.jsonl' -o -name '*.log' \) -size -8M \
     | grep -v shards | while read -r f; do mkdir -p "$R/$n/$(dirname "$f")"; cp "$f" "$R/$n/$f"; done)
done
cp /tmp/llmc-build/*.log $R/ 2>/dev/null
tar czf $OUT/call2.tgz -C $R .
cat $R/times.txt
for f in $R/*_console.txt; do echo "== $(basename $f)"; grep -E "^(d12|d24|d48) |/ llm.c|rror" $f | tail -n 4; done
grep -h "cuBLAS workspaces held\|NVML peaks" $R/*_console.txt /mnt/ram/*/log_*.txt 2>/dev/null | head -20
