set -u
eval "$(bash .gpu/wheels.sh install /tmp/site /tmp/w1 $(pwd)/.gpu/wheels/2)"
export PYTHONPATH=$PYTHONPATH:$(pwd)
mkdir -p $OUT; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/gpu.txt; date -u > $OUT/times.txt
S=/tmp/bench
python - $S/shards <<'PY'
import sys
from pathlib import Path
import numpy as np
from data.shards import write_shard
out = Path(sys.argv[1]); out.mkdir(parents=True, exist_ok=True)
rng = np.random.default_rng(0)
for name, n in (("synthetic_val_000000.bin", 2**21 + 1), ("synthetic_train_000001.bin", 20 * 524288 + 1)):
    write_shard(out / name, rng.integers(0, 50257, n, dtype=np.uint16))
PY
FLAGS="$(OUT=$S bash bench/run_train_gpu.sh --print-train-flags) --out-dir /tmp/p4 --max-steps 16 --warmup-steps 4"
timeout 300 python -m torch.distributed.run --standalone --nproc_per_node=4 -m bench.profile_train --profile-steps 12 3 --out $OUT/prof4.json -- $FLAGS > $OUT/prof4.log 2>&1
date -u >> $OUT/times.txt
python - $OUT/prof4.json > $OUT/kernels4.txt <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
print({k: v for k, v in d.items() if k not in ('flags', 'top_kernels_ms_per_step')})
for r in d['top_kernels_ms_per_step'][:45]: print(r)
PY
head -c 6000 $OUT/kernels4.txt; rm -f $OUT/*.gz
