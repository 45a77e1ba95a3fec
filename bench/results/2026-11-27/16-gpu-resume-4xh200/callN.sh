set -u
export PYTHONPATH=/tmp/site:$(find /tmp/site -maxdepth 3 -type d -name dsl_packages | head -1):$(pwd)
mkdir -p $OUT; date -u > $OUT/times.txt
timeout 200 python -m pytest -q -p no:cacheprovider -rs tests/test_train_resume_gpu.py > $OUT/t_resume.txt 2>&1; tail -3 $OUT/t_resume.txt
date -u >> $OUT/times.txt
CUDA_VISIBLE_DEVICES=0 timeout 200 python -m pytest -q -p no:cacheprovider tests/test_kernels_*.py tests/test_train_step.py > $OUT/t_gpu.txt 2>&1; tail -1 $OUT/t_gpu.txt
date -u >> $OUT/times.txt
CUDA_VISIBLE_DEVICES=0 timeout 100 python -m bench.numerics > $OUT/numerics.txt 2>&1; grep -v Warn $OUT/numerics.txt | tail -3
date -u >> $OUT/times.txt
