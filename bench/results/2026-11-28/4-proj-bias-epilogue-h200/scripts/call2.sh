# call 2 (GPU 0: llm.c and ours at d48, then d24, new code; GPU 1: bench.numerics d24 and d48 over 50 steps,
# then the kernel tests on the GPU)
export PYTHONUNBUFFERED=1
R=/tmp/r2; mkdir -p $R
eval "$(bash .exp/wheels.sh install /tmp/site /tmp/w1 "$(pwd)/.whl/2")"
echo "PYTHONPATH=$PYTHONPATH" > $R/install.txt
ls /tmp/site | grep dist-info >> $R/install.txt
python3 -c "import quack, flash_attn.cute, cutlass; print('gpu extra imports')" >> $R/install.txt 2>&1
mkdir -p /mnt/ram && mount -t tmpfs -o size=150g tmpfs /mnt/ram  # ours' 30 GB final checkpoint: memory, not disk
{ date; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv; nvidia-smi topo -m;
  python3 -c "import torch, triton; print(torch.__version__, torch.version.cuda, triton.__version__)"; nvcc --version | tail -2; nproc; git log -1 --format=%H 2>/dev/null; } > $R/machine.txt 2>&1
(
  export CUDA_VISIBLE_DEVICES=0
  python3 -m bench.peer_llmc --source .exp/llmc --build-only > $R/llmc_build_console.txt 2>&1
  cp llmc_build.log $R/ 2>/dev/null
  date > $R/a_d48_start.txt
  OUT=/mnt/ram/a48 LLMC=.exp/llmc MODELS=d48 GPUS=1 STEPS=14 SKIP=6 bash bench/run_llmc_gpu.sh > $R/a48_console.txt 2>&1
  date > $R/a_d24_start.txt
  OUT=/mnt/ram/a24 LLMC=.exp/llmc MODELS=d24 GPUS=1 STEPS=20 SKIP=6 bash bench/run_llmc_gpu.sh > $R/a24_console.txt 2>&1
  date > $R/a_end.txt
) &
(
  export CUDA_VISIBLE_DEVICES=1
  python3 -m bench.numerics --model d24 --steps 50 --json $R/numerics_d24.json > $R/numerics_d24.txt 2>&1
  python3 -m bench.numerics --model d48 --batch-size 2 --steps 50 --json $R/numerics_d48.json > $R/numerics_d48.txt 2>&1
  date > $R/b_end.txt
) &
(
  export CUDA_VISIBLE_DEVICES=1
  timeout 400 python3 -m pytest tests/test_kernels_linear.py tests/test_kernels_mlp.py tests/test_kernels_layernorm.py \
    tests/test_kernels_model.py -q -p no:cacheprovider > $R/pytest_gpu.txt 2>&1
  echo "rc $?" >> $R/pytest_gpu.txt
) &
wait
