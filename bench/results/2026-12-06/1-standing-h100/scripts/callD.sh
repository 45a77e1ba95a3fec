# call D (right after C, warm, same GPU): the d48 and d24 pairs again, llm.c first this time, into a second folder
#   (/mnt/ram/b2, the same shards), to see how far one run of each trainer moves within the machine and with the order
export PYTHONUNBUFFERED=1; eval "$(cat /tmp/site_env.sh)"
R=/tmp/rD; mkdir -p $R; T0=$(date +%s); DEADLINE=${DEADLINE:-560}
left() { echo $(( DEADLINE - ($(date +%s) - T0) )); }
mark() { echo "$1 $(date -u +%T) rc $2 left $(left)" >> $R/times.txt; }
echo "start $(date -u +%T) $(nvidia-smi --query-gpu=name,uuid --format=csv,noheader)" > $R/times.txt
S=bench/results/2026-12-06/1-standing-h100/scripts
bench() {  # bench NAME TRAINERS MODEL
  TORCHINDUCTOR_CACHE_DIR=/tmp/inductor-s PYTHON=$(pwd)/$S/stop_after_steps.sh SHARDS=/mnt/ram/shards OUT=/mnt/ram/b2 \
    LLMC=/tmp/llmc-build TRAINERS=$2 MODELS=$3 GPUS=1 STEPS=14 SKIP=6 timeout $(( $(left) - 8 )) \
    bash bench/run_llmc_gpu.sh > $R/${1}_console.txt 2>&1; mark $1 $?
}
bench l48 llmc d48
(( $(left) > 150 )) && bench o48 ours d48
(( $(left) > 60 )) && bench l24 llmc d24
(( $(left) > 70 )) && bench o24 ours d24
echo "collect $(date -u +%T)" >> $R/times.txt; mkdir -p $R/b2
(cd /mnt/ram/b2 && find . -maxdepth 3 \( -name '*.txt' -o -name '*.json' -o -name '*.jsonl' \) -size -8M \
   | while read -r f; do mkdir -p "$R/b2/$(dirname "$f")"; cp "$f" "$R/b2/$f"; done)
tar czf $OUT/callD.tgz -C $R .
cat $R/times.txt; for f in $R/*_console.txt; do echo "== $(basename $f)"; grep -E "^(d24|d48) |gpt2.train /|rror" $f | tail -n 6; done
