# every config, old tree and new tree, one single-threaded process each (as the suite runs), 14 at a time
export TRITON_INTERPRET=1 OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1
root=$(pwd)
configs=(
"2 4 256 128 2 50257 0" "2 4 256 128 2 8192 0" "2 4 256 128 2 2048 0" "2 4 256 128 2 512 0"
"2 4 128 128 2 8192 0" "2 4 128 128 2 2048 0" "2 4 128 64 2 2048 0" "2 4 256 64 2 2048 0"
"2 4 256 128 2 8192 1" "2 4 256 128 2 2048 1" "2 4 128 128 2 2048 1" "2 4 256 128 2 8192 2" "2 4 256 128 2 2048 2"
"2 4 128 128 2 2048 2"
)
for tree in old new; do
  dir=$root; [[ $tree == old ]] && dir=$root/.exp/old
  for c in "${configs[@]}"; do
    (cd "$dir" && PYTHONPATH="$dir" timeout 240 python3 "$root/.exp/tie_probe.py" $c | sed "s/^/$tree /") &
  done
done
wait
