# call 1a: the gpu extra's first wheels part to /tmp (the two parts travel in two calls); the machine
cp -r .whl/1 /tmp/w1
{ date -u; nvidia-smi; nvidia-smi --query-gpu=index,name,uuid,pci.bus_id,driver_version,memory.total,memory.used --format=csv
  python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__, 'cudnn', torch.backends.cudnn.version())"
  nvcc --version | tail -2; python3 --version; nproc; free -g | head -2; which ncu; } > $OUT/call1a_machine.txt 2>&1
cat $OUT/call1a_machine.txt
