# call A (1 x H100, a fresh machine): the machine and its versions; the gpu extra's first wheels part, wheels.sh and
#   build-nanogpt's checkout to /tmp (call B, made at once, carries the second part and nothing of .exp); a tmpfs for
#   the shards and runs; llm.c (.exp/llmc, with cudnn-frontend's include/) copied to /tmp and built there in the
#   background, in a session of its own so that it runs on into call B; its end is written to its console.
cp -r .whl/r/1 /tmp/w1; cp .exp/wheels.sh /tmp/wheels.sh; cp -r .exp/build-nanogpt /tmp/nanogpt
mkdir -p /mnt/ram && mount -t tmpfs -o size=64g tmpfs /mnt/ram
cp -r .exp/llmc /tmp/llmc-src
setsid nohup bash -c 'echo "build start $(date -u +%T)"; python3 -m bench.peer_llmc --source /tmp/llmc-src --build-only --out /tmp/llmc_build_only.json; rc=$?; echo "build end $(date -u +%T) rc $rc"' > /tmp/llmc_build_console.txt 2>&1 < /dev/null &
{ date -u; nvidia-smi
  nvidia-smi --query-gpu=index,name,uuid,pci.bus_id,driver_version,memory.total,memory.used,clocks.max.sm,clocks.max.mem,power.limit,temperature.gpu --format=csv
  python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__, 'cudnn', torch.backends.cudnn.version(), 'nccl', torch.cuda.nccl.version(), 'gpus', torch.cuda.device_count(), torch.cuda.get_device_name(0))"
  python3 -c "import numpy, tiktoken; print('numpy', numpy.__version__, 'tiktoken', tiktoken.__version__)"
  nvcc --version | tail -2; python3 --version; nproc; lscpu | grep -E "^Model name"; free -g | head -2; ls /usr/lib/x86_64-linux-gnu/libcudnn.so.* 2>/dev/null | head -3
} > $OUT/callA_machine.txt 2>&1
sleep 2; cat $OUT/callA_machine.txt; cat /tmp/llmc_build_console.txt
