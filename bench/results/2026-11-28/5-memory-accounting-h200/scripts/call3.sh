# call 3 (a fresh machine): the gpu extra's first wheels to /tmp, and the machine
cp -r .whl/1 /tmp/w1
{ date -u; nvidia-smi --query-gpu=index,name,uuid,pci.bus_id,driver_version,memory.total,memory.used --format=csv; } > $OUT/call3_machine.txt 2>&1
cat $OUT/call3_machine.txt
