# call 3 (one H200, a fresh machine, the working tree of 46351fe; the `gpu` extra not installed):
# the machine, then python -m bench.numerics at d48 (B=2, 50 steps), then what configure_kernels picks at d48
export PYTHONUNBUFFERED=1; set -o pipefail; M=$OUT/machine.txt
{ echo "start $(date -u)"; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; python3 -c "import torch,triton;print('torch',torch.__version__,'cuda',torch.version.cuda,'triton',triton.__version__)"; python3 --version; python3 -c "import quack" 2>&1 | tail -1; } > $M 2>&1
echo "numerics start $(date -u +%T)" >> $M
timeout 230 python3 -m bench.numerics --model d48 --batch-size 2 --steps 50 --json $OUT/numerics_d48.json 2>&1 | tee $OUT/numerics_d48.txt
echo "numerics rc $? end $(date -u +%T)" >> $M
timeout 25 python3 -c "import kernels; from gpt2.config import GPTConfig as G; c=G.from_descriptor('d48'); print('configure_kernels d48:', kernels.configure_kernels(c.n_head, c.head_size))" >> $M 2>&1
echo "end $(date -u)" >> $M; cat $M
