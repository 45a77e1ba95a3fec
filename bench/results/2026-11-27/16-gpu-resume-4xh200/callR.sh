set -u
eval "$(bash .gpu/wheels.sh install /tmp/site /tmp/w1 $(pwd)/.gpu/wheels/2)"
export PYTHONPATH=$PYTHONPATH:$(pwd)
mkdir -p $OUT; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/gpu.txt; date -u > $OUT/times.txt
timeout 400 python -m pytest -v -p no:cacheprovider -rs tests/test_train_resume_gpu.py > $OUT/t_resume.txt 2>&1; grep -E "PASS|FAIL|SKIP|passed|failed" $OUT/t_resume.txt | tail -5
date -u >> $OUT/times.txt
