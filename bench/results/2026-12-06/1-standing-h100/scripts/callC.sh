# call C (right after B, warm: llm.c built, the gpu extra in /tmp/site, shards and B's results in /mnt/ram/b): any d24
#   run that B left out (ours, then llm.c, into B's folder, whose summary then holds every d48 and d24 run), then d12
#   (B=64, 524,288 tokens a step): `PEER=build-nanogpt STEPS=24 SKIP=8 bash bench/run_train_gpu.sh` (build-nanogpt's
#   train_gpt2.py under torch.compile first, then ours; one GPU, the machine's only one). Ours at d12 runs with plain
#   python3 (not stopped after its last step: that script's torchrun pipeline has no `|| true`, so a stop would end it
#   before its summary; the final checkpoint it writes after the last step is small at d12 and untimed).
export PYTHONUNBUFFERED=1; eval "$(cat /tmp/site_env.sh)"
R=/tmp/rC; mkdir -p $R; T0=$(date +%s); DEADLINE=${DEADLINE:-570}
left() { echo $(( DEADLINE - ($(date +%s) - T0) )); }
mark() { echo "$1 $(date -u +%T) rc $2 left $(left)" >> $R/times.txt; }
echo "start $(date -u +%T) $(nvidia-smi --query-gpu=name,uuid --format=csv,noheader)" > $R/times.txt
S=bench/results/2026-12-06/1-standing-h100/scripts
bench() {  # bench NAME TRAINERS MODEL
  TORCHINDUCTOR_CACHE_DIR=/tmp/inductor-s PYTHON=$(pwd)/$S/stop_after_steps.sh SHARDS=/mnt/ram/shards OUT=/mnt/ram/b \
    LLMC=/tmp/llmc-build TRAINERS=$2 MODELS=$3 GPUS=1 STEPS=14 SKIP=6 timeout $(( $(left) - 8 )) \
    bash bench/run_llmc_gpu.sh > $R/${1}_console.txt 2>&1; mark $1 $?
}
n24=$(grep -c '"kind": "train"' /mnt/ram/b/run_d24_1gpu/metrics.jsonl 2>/dev/null); (( ${n24:-0} >= 14 )) || bench o24 ours d24
[ -f /mnt/ram/b/llmc_d24_1gpu.json ] || bench l24 llmc d24
TORCHINDUCTOR_CACHE_DIR=/tmp/inductor-s PYTHON=python3 PEER=/tmp/nanogpt OUT=/mnt/ram/d12 STEPS=24 SKIP=8 \
  timeout $(( $(left) - 12 )) bash bench/run_train_gpu.sh > $R/d12_console.txt 2>&1; mark d12 $?
echo "collect $(date -u +%T)" >> $R/times.txt
for d in b d12; do mkdir -p $R/$d
  (cd /mnt/ram/$d && find . -maxdepth 3 \( -name '*.txt' -o -name '*.json' -o -name '*.jsonl' \) -size -8M \
     | while read -r f; do mkdir -p "$R/$d/$(dirname "$f")"; cp "$f" "$R/$d/$f"; done)
done
tar czf $OUT/callC.tgz -C $R .
cat $R/times.txt
for f in $R/*_console.txt; do echo "== $(basename $f)"; grep -E "^(d12|d24|d48) |rror|gpt2.train|build-nanogpt|scaling" $f | tail -n 10; done
