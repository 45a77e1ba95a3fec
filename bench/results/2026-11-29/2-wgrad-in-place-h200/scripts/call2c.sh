# call 2c (the same machine, warm: the gpu extra still in /tmp/site): python -m bench.numerics at d24 (50 steps) on
#   this tree, then ours d24 new and old (bench/run_llmc_gpu.sh, TRAINERS=ours), then the numerics at d48
#   (B=2, 50 steps) while time is left.
export PYTHONUNBUFFERED=1
R=/tmp/r3; mkdir -p $R; T0=$(date +%s); DEADLINE=${DEADLINE:-290}
eval "$(cat /tmp/site_env.sh)"
root=$(pwd)
left() { echo $(( DEADLINE - ($(date +%s) - T0) )); }
mark() { echo "$1 $(date -u +%T) rc $2 left $(left)" >> $R/times.txt; }
ours() {  # ours TREE MODEL STEPS NAME
  local dir=$root; [[ $1 == old ]] && dir=$root/.exp/old
  (cd "$dir" && OUT=/mnt/ram/$4 TRAINERS=ours MODELS=$2 GPUS=1 STEPS=$3 SKIP=6 \
     bash bench/run_llmc_gpu.sh > $R/${4}_console.txt 2>&1); mark $4 $?
  find /mnt/ram/$4 -size +50M -delete
}
numerics() {  # numerics NAME FLAGS...
  local name=$1; shift
  timeout $(( $(left) - 10 )) python3 -m bench.numerics "$@" --json $R/numerics_$name.json > $R/numerics_$name.txt 2>&1
  mark numerics_$name $?
}
echo "start $(date -u +%T)" > $R/times.txt
(
  numerics d24 --model d24 --steps 50
  (( $(left) > 150 )) && ours new d24 20 n24
  (( $(left) > 90 )) && ours old d24 20 o24
  (( $(left) > 100 )) && numerics d48 --model d48 --batch-size 2 --steps 50
) &
while [ -n "$(jobs -rp)" ] && (( $(left) > 0 )); do sleep 3; done
echo "collect $(date -u +%T), jobs still running: $(jobs -rp | wc -l)" >> $R/times.txt
for d in /mnt/ram/n24 /mnt/ram/o24; do
  [ -d $d ] || continue; n=$(basename "$d"); mkdir -p "$R/$n"
  (cd "$d" && find . -maxdepth 3 \( -name '*.txt' -o -name '*.json' -o -name '*.jsonl' \) -size -8M \
     | while read -r f; do mkdir -p "$R/$n/$(dirname "$f")"; cp "$f" "$R/$n/$f"; done)
done
tar czf $OUT/call2c.tgz -C $R .
cat $R/times.txt
for f in $R/*_console.txt; do echo "== $(basename $f)"; grep -E "^(d24|d48) |rror" $f | tail -n 3; done
for f in $R/numerics_*.txt; do echo "== $f"; grep -E "PASS|FAIL" $f; done
