set -u
eval "$(bash .gpu/wheels.sh install /tmp/site /tmp/w1 $(pwd)/.gpu/wheels/2)"
mkdir -p $OUT
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/gpu.txt
python -c "import torch, triton; print(torch.__version__, triton.__version__)" | tee -a $OUT/gpu.txt
export CUDA_VISIBLE_DEVICES=0
date -u; PEER=$(pwd)/.gpu/peer STEPS=24 SKIP=8 OUT=$OUT/bench timeout 400 bash bench/run_train_gpu.sh > $OUT/bench.txt 2>&1; tail -8 $OUT/bench.txt
date -u; (cd .gpu/base_tree && OUT=$OUT/base STEPS=24 SKIP=8 timeout 150 bash bench/run_train_gpu.sh > $OUT/base.log 2>&1); tail -3 $OUT/base.log; date -u
