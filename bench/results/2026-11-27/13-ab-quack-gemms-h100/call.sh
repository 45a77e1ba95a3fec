set -u
eval "$(bash .gpu/wheels.sh install /tmp/site /tmp/w1 $(pwd)/.gpu/wheels/2)"
mkdir -p $OUT
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
PYTHONPATH=$PYTHONPATH:$(pwd) timeout 150 python -m pytest -q -p no:cacheprovider tests/test_kernels_linear.py tests/test_kernels_mlp.py > $OUT/t_linear_mlp.txt 2>&1; tail -2 $OUT/t_linear_mlp.txt
export STEPS=20 SKIP=6 CUDA_VISIBLE_DEVICES=0
run_base() { (cd .gpu/base_tree && OUT=$OUT/$1 timeout 200 bash bench/run_train_gpu.sh > $OUT/$1.log 2>&1); tail -3 $OUT/$1.log; }
run_new() { OUT=$OUT/$1 timeout 200 bash bench/run_train_gpu.sh > $OUT/$1.log 2>&1; tail -3 $OUT/$1.log; }
date -u; run_base base1; date -u; run_new new1; date -u; run_base base2; date -u; run_new new2; date -u
grep -h "sdpa_backend\|kernels" $OUT/new1/*/config.json 2>/dev/null | head -3
