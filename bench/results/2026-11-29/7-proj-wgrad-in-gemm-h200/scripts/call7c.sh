# call 7c (right after 7b, warm: the gpu extra in /tmp/site, llm.c built, shards in /mnt/ram), on this tree: the GPU
#   tests of the files this round changed, bench.numerics at d48 (B=2) and d24, 50 steps each, then, while time is
#   left, d24 at B=32 (ours, then llm.c), one after the other on the one GPU
export PYTHONUNBUFFERED=1; eval "$(cat /tmp/site_env.sh)"
R=$OUT; T0=$(date +%s); DEADLINE=${DEADLINE:-560}
left() { echo $(( DEADLINE - ($(date +%s) - T0) )); }
mark() { echo "$1 $(date -u +%T) rc $2 left $(left)" >> $R/times.txt; }
echo "start $(date -u +%T)" > $R/times.txt
timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_kernels_linear.py tests/test_kernels_mlp.py \
  tests/test_train_step.py tests/test_kernels_grad_layout.py > $R/pytest_gpu.txt 2>&1; mark pytest $?
timeout 200 python3 -m bench.numerics --model d48 --batch-size 2 --steps 50 --json $R/numerics_d48.json > $R/numerics_d48.txt 2>&1; mark numerics_d48 $?
timeout $(( $(left) - 5 )) python3 -m bench.numerics --model d24 --steps 50 --json $R/numerics_d24.json > $R/numerics_d24.txt 2>&1; mark numerics_d24 $?
if (( $(left) > 200 )); then
  TORCHINDUCTOR_CACHE_DIR=/tmp/inductor-gemm SHARDS=/mnt/ram/shards OUT=/mnt/ram/gemm24 TRAINERS=ours MODELS=d24 GPUS=1 \
    STEPS=14 SKIP=6 timeout $(( $(left) - 60 )) bash bench/run_llmc_gpu.sh > $R/gemm24_console.txt 2>&1; mark gemm24 $?
  OUT=/mnt/ram/l24 SHARDS=/mnt/ram/shards LLMC=.exp/llmc TRAINERS=llmc MODELS=d24 GPUS=1 STEPS=14 SKIP=6 \
    timeout $(( $(left) - 3 )) bash bench/run_llmc_gpu.sh > $R/l24_console.txt 2>&1; mark l24 $?
fi
cat $R/times.txt; tail -n 2 $R/pytest_gpu.txt $R/numerics_d48.txt $R/numerics_d24.txt
for f in $R/*_console.txt; do echo "== $(basename $f)"; grep -E "^(d24|d48) |rror" $f | tail -n 3; done
