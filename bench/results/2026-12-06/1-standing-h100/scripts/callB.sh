# call B (right after A, warm; .whl/r/2 carried): the gpu extra installed; on this tree's code, on the one GPU, one
#   run after the other, all results in one folder (/mnt/ram/b) so that bench/run_llmc_gpu.sh's summary gives ours /
#   llm.c: d48 (B=16, T=1024, 131,072 tokens a step) ours, then llm.c (built in A's background, run from its build
#   folder); then d24 (B=32, 131,072) ours and llm.c while time is left. Ours is stopped once its 14th step is logged
#   (stop_after_steps.sh: the final checkpoint is no part of the timed steps).
export PYTHONUNBUFFERED=1
R=/tmp/rB; mkdir -p $R; T0=$(date +%s); DEADLINE=${DEADLINE:-570}
left() { echo $(( DEADLINE - ($(date +%s) - T0) )); }
mark() { echo "$1 $(date -u +%T) rc $2 left $(left)" >> $R/times.txt; }
echo "start $(date -u +%T) $(nvidia-smi --query-gpu=name,uuid --format=csv,noheader)" > $R/times.txt
eval "$(bash /tmp/wheels.sh install /tmp/site /tmp/w1 "$(pwd)/.whl/r/2" | tee /tmp/site_env.sh)"
python3 -c "import quack, flash_attn.cute, cutlass, importlib.metadata as m; print('gpu extra imports;', *(f'{p} {m.version(p)}' for p in ('quack-kernels', 'flash-attn-4', 'nvidia-cutlass-dsl', 'nvidia-cutlass-dsl-libs-core', 'nvidia-cutlass-dsl-libs-cu13', 'apache-tvm-ffi', 'torch-c-dlpack-ext', 'einops')))" > $R/install.txt 2>&1; mark install $?
S=bench/results/2026-12-06/1-standing-h100/scripts
bench() {  # bench NAME TRAINERS MODEL
  TORCHINDUCTOR_CACHE_DIR=/tmp/inductor-s PYTHON=$(pwd)/$S/stop_after_steps.sh SHARDS=/mnt/ram/shards OUT=/mnt/ram/b \
    LLMC=/tmp/llmc-build TRAINERS=$2 MODELS=$3 GPUS=1 STEPS=14 SKIP=6 timeout $(( $(left) - 8 )) \
    bash bench/run_llmc_gpu.sh > $R/${1}_console.txt 2>&1; mark $1 $?
}
waitbuild() {  # until A's build has ended
  for _ in $(seq 150); do grep -q "^build end" /tmp/llmc_build_console.txt && break; sleep 2; done
  mark build-seen $([ -x /tmp/llmc-build/train_gpt2cu ]; echo $?)
}
bench o48 ours d48
waitbuild; bench l48 llmc d48
(( $(left) > 170 )) && bench o24 ours d24
(( $(left) > 60 )) && bench l24 llmc d24
echo "collect $(date -u +%T)" >> $R/times.txt
cp /tmp/llmc_build_console.txt /tmp/llmc_build.log $R/ 2>/dev/null
d=/mnt/ram/b; mkdir -p $R/b
(cd $d && find . -maxdepth 3 \( -name '*.txt' -o -name '*.json' -o -name '*.jsonl' \) -size -8M \
   | while read -r f; do mkdir -p "$R/b/$(dirname "$f")"; cp "$f" "$R/b/$f"; done)
tar czf $OUT/callB.tgz -C $R .
cat $R/times.txt; cat /tmp/llmc_build_console.txt
for f in $R/*_console.txt; do echo "== $(basename $f)"; grep -E "^(d24|d48) |rror|gpt2.train /|stop_after" $f | tail -n 8; done
