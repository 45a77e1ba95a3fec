# call 1: the gpu extra's first wheels to /tmp (they travel in two calls); the machine; the CUDA-context probe
# on GPU 1 (expandable segments as gpt2.train sets them, then off); the GPU tests of the files this round touches on
# GPU 0. The extra is not needed for any of these.
export PYTHONUNBUFFERED=1
cp -r .whl/1 /tmp/w1
R=$OUT
{ date -u; nvidia-smi; nvidia-smi --query-gpu=index,name,uuid,pci.bus_id,driver_version,memory.total,memory.used,memory.reserved --format=csv
  nvidia-smi topo -m
  python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__, 'cudnn', torch.backends.cudnn.version())"
  python3 -m pip show nvidia-ml-py 2>/dev/null | head -2; nvcc --version | tail -2; python3 --version; nproc; free -g | head -2; } > $R/call1_machine.txt 2>&1
(
  export CUDA_VISIBLE_DEVICES=1
  python3 -m bench.train_memory --context-probe --json $R/call1_probe.json > $R/call1_probe.txt 2>&1
  echo "== PYTORCH_CUDA_ALLOC_CONF=expandable_segments:False" >> $R/call1_probe.txt
  PYTORCH_CUDA_ALLOC_CONF=expandable_segments:False python3 -m bench.train_memory --context-probe \
    --json $R/call1_probe_noexp.json >> $R/call1_probe.txt 2>&1
) &
(
  export CUDA_VISIBLE_DEVICES=0
  timeout 400 python3 -m pytest -q -p no:cacheprovider -x tests/test_kernels_stochastic_round.py \
    tests/test_train_master_weights.py tests/test_kernels_layernorm.py > $R/call1_pytest_gpu.txt 2>&1
  echo "rc $?" >> $R/call1_pytest_gpu.txt
) &
wait
date -u >> $R/call1_machine.txt
cat $R/call1_probe.txt
tail -n 5 $R/call1_pytest_gpu.txt
