# call 9d (right after 9c, warm): the gpu extra installed; the GPU resume test of this tree, on 2 GPUs under ZeRO-1
#   (each rank's parameters in the optimizer's bucket): SIGKILLed between checkpoints, resumed, bit for bit
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
eval "$(bash .exp/wheels.sh install /tmp/site /tmp/w1 "$(pwd)/.whl/r/2")"
date -u > $OUT/call9d_pytest.txt
timeout ${LIMIT:-270} python3 -m pytest -q -p no:cacheprovider -rs tests/test_train_resume_gpu.py -k "2gpus-zero1" >> $OUT/call9d_pytest.txt 2>&1
echo "rc $?" >> $OUT/call9d_pytest.txt; date -u >> $OUT/call9d_pytest.txt; tail -25 $OUT/call9d_pytest.txt
