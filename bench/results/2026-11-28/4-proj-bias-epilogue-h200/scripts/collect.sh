# the small files of a call into one archive under $OUT (runs' logs, metrics, configs, nvidia-smi traces; no checkpoints)
R=$1; name=$2
for d in /mnt/ram/*/; do
  [ -d "$d" ] || continue
  n=$(basename "$d"); mkdir -p "$R/$n"
  (cd "$d" && find . -maxdepth 3 \( -name '*.txt' -o -name '*.json' -o -name '*.jsonl' -o -name '*.log' \) -size -8M \
     | grep -v shards | while read -r f; do mkdir -p "$R/$n/$(dirname "$f")"; cp "$f" "$R/$n/$f"; done)
done
tar czf "$OUT/$name.tgz" -C "$R" .
