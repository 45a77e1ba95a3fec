set -u
eval "$(bash .gpu/wheels.sh install /tmp/site /tmp/w1 $(pwd)/.gpu/wheels/2)"
mkdir -p $OUT
export PYTHONPATH=$PYTHONPATH:$(pwd)
date -u; timeout 100 python -m bench.numerics > $OUT/numerics.txt 2>&1; grep -v Warn $OUT/numerics.txt | tail -4
date -u; timeout 150 python -m pytest -q -p no:cacheprovider tests/test_kernels_linear.py > $OUT/t_linear.txt 2>&1; tail -1 $OUT/t_linear.txt; date -u
