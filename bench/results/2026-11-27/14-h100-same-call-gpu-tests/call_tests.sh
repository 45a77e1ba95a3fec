set -u
eval "$(bash .gpu/wheels.sh install /tmp/site /tmp/w1 $(pwd)/.gpu/wheels/2)"
mkdir -p $OUT
export PYTHONPATH=$PYTHONPATH:$(pwd)
date -u; timeout 330 python -m pytest -q -p no:cacheprovider tests/test_kernels_*.py tests/test_train_step.py > $OUT/t_gpu.txt 2>&1; tail -3 $OUT/t_gpu.txt
date -u; timeout 150 python -m pytest -q -p no:cacheprovider tests/test_train_resume_gpu.py > $OUT/t_resume.txt 2>&1; tail -2 $OUT/t_resume.txt
date -u; timeout 100 python -m bench.numerics > $OUT/numerics.txt 2>&1; tail -3 $OUT/numerics.txt; date -u
