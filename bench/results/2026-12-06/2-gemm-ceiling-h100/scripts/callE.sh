# call E (right after D, warm; carries .whl/r/2): the gpu extra installed; random-token shards as
#   bench/run_llmc_gpu.sh writes them; bench.profile_train at d24 (B=32, 131,072 tokens, `--keep-mlp-post-gb 6.5`)
#   and d12 (B=64, 524,288, gpt2.train's defaults), steps 8-10 of 11 profiled; then llm.c (built in D's background)
#   at d48 and d24 through bench/run_llmc_gpu.sh (TRAINERS=llmc), for this machine's targets.
export PYTHONUNBUFFERED=1
R=$OUT; T0=$(date +%s); DEADLINE=${DEADLINE:-570}
left() { echo $(( DEADLINE - ($(date +%s) - T0) )); }
mark() { echo "$1 $(date -u +%T) rc $2 left $(left)" >> $R/times.txt; }
echo "start $(date -u +%T) $(nvidia-smi --query-gpu=name,uuid --format=csv,noheader)" > $R/times.txt
eval "$(bash /tmp/wheels.sh install /tmp/site /tmp/w1 "$(pwd)/.whl/r/2" | tee /tmp/site_env.sh)"
python3 -c "import quack, flash_attn.cute, cutlass" && mark install 0
python3 - <<'PY'
from pathlib import Path
import numpy as np
from data.shards import write_shard
out = Path("/mnt/ram/shards"); out.mkdir(parents=True, exist_ok=True); rng = np.random.default_rng(0)
for name, n in (("synthetic_val_000000.bin", 2**21 + 1), ("synthetic_train_000001.bin", 15 * 524288 + 1)):
    write_shard(out / name, rng.integers(0, 50257, n, dtype=np.uint16))
PY
mark shards $?
export TORCHINDUCTOR_CACHE_DIR=/tmp/inductor-s
prof() {  # prof MODEL B TOKENS KEEP_POST_GB
  timeout $(( $(left) - 150 )) python3 -m bench.profile_train --profile-steps 8 3 --out /mnt/ram/prof$1.json -- \
    --model $1 --batch-size $2 --seq-len 1024 --total-batch-size $3 --max-steps 11 --warmup-steps 3 \
    --train-data "/mnt/ram/shards/*_train_*.bin" --val-data "/mnt/ram/shards/*_val_*.bin" --val-every 0 \
    --hellaswag-every 0 --sample-every 0 --checkpoint-every 0 --log-every 5 --out-dir /mnt/ram/p$1 --no-resume \
    --keep-mlp-post-gb $4 > $R/prof$1_console.txt 2>&1; mark prof$1 $?
  cp /mnt/ram/prof$1.json /mnt/ram/prof$1.trace.json.gz $R/ 2>/dev/null
}
prof d24 32 131072 6.5
prof d12 64 524288 2.5
grep -q "^build end" /tmp/llmc_build_console.txt; mark build-seen $?
for m in d48 d24; do
  (( $(left) > 80 )) && SHARDS=/mnt/ram/shards OUT=/mnt/ram/l LLMC=/tmp/llmc-build TRAINERS=llmc MODELS=$m GPUS=1 \
    STEPS=14 SKIP=6 timeout $(( $(left) - 10 )) bash bench/run_llmc_gpu.sh > $R/l_console_$m.txt 2>&1; mark llmc$m $?
done
cat $R/times.txt /tmp/llmc_build_console.txt; grep -E "^(d48|d24) " $R/l_console_*.txt
for m in d24 d12; do grep -E "wall_ms|busy_ms|idle" $R/prof${m}_console.txt; done
