# call 3: the code before (old, .exp/old) against this one (new), ours alone, same GPU one after the other:
# GPU 0 d48 old then new; GPU 1 d24 old, new, old, new
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages
R=/tmp/r3; mkdir -p $R; rm -rf /mnt/ram/*; date > $R/start.txt
root=$(pwd)
run() {  # run TREE MODEL STEPS NAME
  local dir=$root; [[ $1 == old ]] && dir=$root/.exp/old
  (cd "$dir" && OUT=/mnt/ram/$4 TRAINERS=ours MODELS=$2 GPUS=1 STEPS=$3 SKIP=6 bash bench/run_llmc_gpu.sh > $R/$4_console.txt 2>&1)
  date > $R/$4_end.txt
}
(export CUDA_VISIBLE_DEVICES=0; run old d48 14 o48; run new d48 14 n48) &
(export CUDA_VISIBLE_DEVICES=1; run old d24 20 o24a; run new d24 20 n24a; run old d24 20 o24b; run new d24 20 n24b) &
wait
