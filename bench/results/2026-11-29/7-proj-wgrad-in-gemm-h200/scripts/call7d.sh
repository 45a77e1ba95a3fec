# call 7d (right after 7c, warm): bench.numerics at d48 (B=2) and d24, 50 steps each, on this tree
export PYTHONUNBUFFERED=1; eval "$(cat /tmp/site_env.sh)"; T0=$(date +%s)
left() { echo $(( 570 - ($(date +%s) - T0) )); }
timeout 300 python3 -m bench.numerics --model d48 --batch-size 2 --steps 50 --json $OUT/numerics_d48.json > $OUT/numerics_d48.txt 2>&1; echo "numerics d48 rc $? $(date -u +%T)" | tee $OUT/times.txt
timeout $(( $(left) - 5 )) python3 -m bench.numerics --model d24 --steps 50 --json $OUT/numerics_d24.json > $OUT/numerics_d24.txt 2>&1; echo "numerics d24 rc $? $(date -u +%T)" | tee -a $OUT/times.txt
tail -n 3 $OUT/numerics_d48.txt $OUT/numerics_d24.txt
