# call A (1 x H100, a fresh machine; carries .whl/r/1 and .exp/wheels.sh): the machine and its versions; the gpu
#   extra's first wheels part and wheels.sh to /tmp for call B; then the GEMM ceiling (cuBLAS only, no extra needed)
#   at d48 (B=16, 131,072 tokens a step), d24 (B=32, 131,072) and d12 (B=64, 524,288), each on one stream and with
#   the weight gradients on a second.
export PYTHONUNBUFFERED=1
cp -r .whl/r/1 /tmp/w1; cp .exp/wheels.sh /tmp/wheels.sh
mkdir -p /mnt/ram && mount -t tmpfs -o size=64g tmpfs /mnt/ram
{ date -u; nvidia-smi
  nvidia-smi --query-gpu=index,name,uuid,pci.bus_id,driver_version,memory.total,clocks.max.sm,clocks.max.mem,power.limit,temperature.gpu --format=csv
  python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__, 'cudnn', torch.backends.cudnn.version(), torch.cuda.get_device_name(0))"
  python3 -c "import importlib.metadata as m; print('nvidia-ml-py', m.version('nvidia-ml-py'))"
  python3 --version; nproc
} > $OUT/callA_machine.txt 2>&1
for spec in "d48 16 131072" "d24 32 131072" "d12 64 524288"; do
  set -- $spec
  timeout 150 python3 -m bench.gemm_ceiling --model $1 --batch-size $2 --total-batch $3 --streams 1 2 --steps 5 \
    --json $OUT/ceiling_$1.json 2>&1 | tee -a $OUT/ceiling_console.txt
done
cat $OUT/callA_machine.txt | tail -8
