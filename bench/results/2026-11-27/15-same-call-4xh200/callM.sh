set -u
eval "$(bash .gpu/wheels.sh install /tmp/site /tmp/w1 $(pwd)/.gpu/wheels/2)"
export PYTHONPATH=$PYTHONPATH:$(pwd)
mkdir -p $OUT
python -c "import quack, flash_attn.cute; print('gpu extra ok')" 2>&1 | tail -1 | tee $OUT/extra.txt
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee $OUT/gpu.txt
nvidia-smi topo -m > $OUT/topo.txt 2>&1
python -c "import torch, triton, sys; print(torch.__version__, triton.__version__, sys.version.split()[0])" | tee -a $OUT/gpu.txt
date -u > $OUT/times.txt
PEER=$(pwd)/.gpu/peer STEPS=24 SKIP=8 OUT=$OUT/bench timeout 540 bash bench/run_train_gpu.sh > $OUT/bench.txt 2>&1
date -u >> $OUT/times.txt
tail -14 $OUT/bench.txt
cp $OUT/bench/summary.json $OUT/summary.json 2>/dev/null
rm -rf $OUT/bench/shards $OUT/bench/run_*gpu/checkpoints
