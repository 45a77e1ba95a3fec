# call 7a: the gpu extra's first wheels part to /tmp (.whl/r/1 carried; the next call, made at once, carries the
#   second part); the machine and its versions
cp -r .whl/r/1 /tmp/w1; { date -u; nvidia-smi --query-gpu=index,name,uuid,pci.bus_id,driver_version,memory.total,memory.used --format=csv; python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__, 'cudnn', torch.backends.cudnn.version())"; nvcc --version | tail -2; python3 --version; nproc; } > $OUT/call7a_machine.txt 2>&1; cat $OUT/call7a_machine.txt
