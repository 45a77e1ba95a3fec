# call 6e (the same machine as 6d, warm: the gpu extra in /tmp/site): bench.numerics at d48 (B=2) and d24, 50 steps
#   each, on this tree; then the GPU tests of the files this round changed, while time is left
export PYTHONUNBUFFERED=1; eval "$(cat /tmp/site_env.sh)"; T0=$(date +%s)
left() { echo $(( 540 - ($(date +%s) - T0) )); }
timeout 240 python3 -m bench.numerics --model d48 --batch-size 2 --steps 50 --json $OUT/numerics_d48.json > $OUT/numerics_d48.txt 2>&1; echo "numerics d48 rc $? $(date -u +%T)" | tee $OUT/times.txt
timeout $(( $(left) - 60 )) python3 -m bench.numerics --model d24 --steps 50 --json $OUT/numerics_d24.json > $OUT/numerics_d24.txt 2>&1; echo "numerics d24 rc $? $(date -u +%T)" | tee -a $OUT/times.txt
timeout $(( $(left) - 5 )) python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_kernels_mlp.py tests/test_kernels_linear.py tests/test_train_step.py > $OUT/pytest_gpu.txt 2>&1; echo "pytest rc $? $(date -u +%T)" | tee -a $OUT/times.txt
tail -n 3 $OUT/numerics_d48.txt $OUT/numerics_d24.txt $OUT/pytest_gpu.txt
