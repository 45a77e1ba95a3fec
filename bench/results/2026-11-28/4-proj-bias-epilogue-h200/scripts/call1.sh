# call 1: the gpu extra's first wheels to /tmp; on the CPU: the kernel tests (interpreter, no GPU) and the tie probe, old and new code
cp -r .whl/1 /tmp/w1
R=/tmp/r1; mkdir -p $R
{ date; nproc; free -g | head -2; df -h /dev/shm /tmp; python3 -c "import torch, triton; print(torch.__version__, triton.__version__)"; } > $R/machine.txt 2>&1
for f in tests/test_kernels_*.py; do
  (CUDA_VISIBLE_DEVICES= timeout 230 python3 -m pytest "$f" -q -x -p no:cacheprovider > "$R/pytest_$(basename "$f" .py).txt" 2>&1; echo "rc $?" >> "$R/pytest_$(basename "$f" .py).txt") &
done
CUDA_VISIBLE_DEVICES= timeout 230 bash .exp/tie_probe.sh > $R/probe.txt 2>&1
wait
cat $R/machine.txt
for f in $R/pytest_*.txt; do echo "== $f"; tail -n 4 "$f"; done
grep -E '^(old|new) ' $R/probe.txt | sort
tar czf $OUT/call1.tgz -C $R .
