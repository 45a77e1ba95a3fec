# call 8b (right after 8a, warm): the gpu extra installed; on this tree's code, d48 at B=16, T=1024 (131,072 tokens a
#   step): ours (--zero1, which on one GPU does nothing) on 1 then 2 GPUs, then llm.c (built in 8a's background, run from its build
#   folder, which holds the cudnn-frontend headers too) on 1 then 2 GPUs, one after the other, all results in one folder (/mnt/ram/b), so that bench/run_llmc_gpu.sh's
#   summary takes ours / llm.c and each trainer's scaling from it; then d24 (B=32) the same way while time is left
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
R=/tmp/r8b; mkdir -p $R; T0=$(date +%s); DEADLINE=${DEADLINE:-565}
left() { echo $(( DEADLINE - ($(date +%s) - T0) )); }
mark() { echo "$1 $(date -u +%T) rc $2 left $(left)" >> $R/times.txt; }
echo "start $(date -u +%T)" > $R/times.txt
eval "$(bash .exp/wheels.sh install /tmp/site /tmp/w1 "$(pwd)/.whl/r/2" | tee /tmp/site_env.sh)"
python3 -c "import quack, flash_attn.cute, cutlass; print('gpu extra imports; quack', quack.__version__)" > $R/install.txt 2>&1; mark install $?
S=bench/results/2026-11-29/8-two-gpus-d48-h200/scripts
bench() {  # bench NAME TRAINERS MODEL [gpu counts]
  TORCHINDUCTOR_CACHE_DIR=/tmp/inductor-8 PYTHON=$(pwd)/$S/stop_after_steps.sh SHARDS=/mnt/ram/shards OUT=/mnt/ram/b \
    LLMC=/tmp/llmc-build TRAINERS=$2 MODELS=$3 GPUS="${4:-1 2}" STEPS=14 SKIP=6 timeout $(( $(left) - 8 )) \
    bash bench/run_llmc_gpu.sh --zero1 > $R/${1}_console.txt 2>&1; mark $1 $?
}
waitbuild() {  # until 8a's build has printed its binary or failed
  for _ in $(seq 150); do grep -qE "^llm.c: |failed|Error|Traceback" /tmp/llmc_build_console.txt && break; sleep 2; done
  mark build-seen $([ -x /tmp/llmc-build/train_gpt2cu ]; echo $?)
}
bench o48 ours d48
waitbuild; bench l48 llmc d48
(( $(left) > 150 )) && bench o24 ours d24
(( $(left) > 90 )) && bench l24 llmc d24
echo "collect $(date -u +%T)" >> $R/times.txt
cp /tmp/llmc_build_console.txt /tmp/llmc_build.log $R/ 2>/dev/null
d=/mnt/ram/b; mkdir -p $R/b
(cd $d && find . -maxdepth 3 \( -name '*.txt' -o -name '*.json' -o -name '*.jsonl' \) -size -8M \
   | while read -r f; do mkdir -p "$R/b/$(dirname "$f")"; cp "$f" "$R/b/$f"; done)
tar czf $OUT/call8b.tgz -C $R .
cat $R/times.txt
for f in $R/*_console.txt; do echo "== $(basename $f)"; grep -E "^(d24|d48) |rror|gpu\)|scaling|stop_after" $f | tail -n 12; done
