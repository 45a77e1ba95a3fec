# call D (1 x H100, a fresh machine; carries .whl/r/1, .exp/wheels.sh and .exp/llmc): the machine and its versions;
#   wheels part 1 and wheels.sh to /tmp for call E; llm.c built in the background (its own session, so it runs on
#   into call E); meanwhile the GEMM ceiling at d48, d24 and d12 on this machine, as call A.
export PYTHONUNBUFFERED=1
cp -r .whl/r/1 /tmp/w1; cp .exp/wheels.sh /tmp/wheels.sh; cp -r .exp/llmc /tmp/llmc-src
mkdir -p /mnt/ram && mount -t tmpfs -o size=64g tmpfs /mnt/ram
setsid nohup bash -c 'echo "build start $(date -u +%T)"; python3 -m bench.peer_llmc --source /tmp/llmc-src --build-only --out /tmp/llmc_build_only.json; echo "build end $(date -u +%T) rc $?"' > /tmp/llmc_build_console.txt 2>&1 < /dev/null &
{ date -u; nvidia-smi --query-gpu=index,name,uuid,pci.bus_id,driver_version,memory.total,clocks.max.sm,power.limit,temperature.gpu --format=csv
  python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__, 'cudnn', torch.backends.cudnn.version(), torch.cuda.get_device_name(0))"
} > $OUT/callD_machine.txt 2>&1
for spec in "d48 16 131072" "d24 32 131072" "d12 64 524288"; do
  set -- $spec
  timeout 150 python3 -m bench.gemm_ceiling --model $1 --batch-size $2 --total-batch $3 --streams 1 --steps 5 \
    --json $OUT/ceiling_$1.json 2>&1 | tee -a $OUT/ceiling_console.txt
done
cat $OUT/callD_machine.txt /tmp/llmc_build_console.txt
