# call 4e (the same machine as 4d, warm: the gpu extra still in /tmp/site): gemm_sites.py again on this machine,
#   then python -m bench.numerics at d48 (B=2, 50 steps), now with the gpu extra (quack's GEMMs at d48's pinned
#   tiles, the GELU-epilogue MLP, the scaled-exp classifier)
export PYTHONUNBUFFERED=1; set -o pipefail; eval "$(cat /tmp/site_env.sh)"; export PYTHONPATH=$(pwd):$PYTHONPATH
timeout 150 python3 bench/results/2026-11-29/4-gemm-cublas-d48-h200/scripts/gemm_sites.py --json $OUT/gemm_sites_machine2.json > $OUT/gemm_sites_machine2.txt 2>&1; echo "gemm_sites rc $?"
{ date -u; python3 -c "import quack; print('quack', quack.__version__)"; } > $OUT/machine_4e.txt 2>&1
timeout 420 python3 -m bench.numerics --model d48 --batch-size 2 --steps 50 --json $OUT/numerics_d48.json 2>&1 | tee $OUT/numerics_d48.txt
echo "numerics rc $? end $(date -u +%T)" >> $OUT/machine_4e.txt; cat $OUT/machine_4e.txt
