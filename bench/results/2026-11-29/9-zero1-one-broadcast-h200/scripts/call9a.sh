# call 9a (2 x H200): the gpu extra's first wheels part to /tmp (.whl/r/1 carried; call 9b, made at once, carries the
#   second); the machine, its versions and how its GPUs are linked; a tmpfs for the shards and runs
cp -r .whl/r/1 /tmp/w1; mkdir -p /mnt/ram && mount -t tmpfs -o size=100g tmpfs /mnt/ram
{ date -u; nvidia-smi --query-gpu=index,name,uuid,pci.bus_id,driver_version,memory.total,memory.used --format=csv
  nvidia-smi topo -m; python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__, 'cudnn', torch.backends.cudnn.version(), 'nccl', torch.cuda.nccl.version(), 'gpus', torch.cuda.device_count())"
  nvcc --version | tail -2; python3 --version; nproc; } > $OUT/call9a_machine.txt 2>&1
cat $OUT/call9a_machine.txt
