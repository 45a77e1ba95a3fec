# call 9c (2 x H200, a fresh machine: wheels part 1 to /tmp; call 9d, made at once, carries the second)
cp -r .whl/r/1 /tmp/w1; nvidia-smi --query-gpu=index,name,driver_version --format=csv > $OUT/call9c_machine.txt 2>&1; cat $OUT/call9c_machine.txt
