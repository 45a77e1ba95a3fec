# Sourced by the bench scripts (bash). smi_ids N: nvidia-smi's ids (-i) of the GPUs a run on N GPUs uses: the first
# N entries of CUDA_VISIBLE_DEVICES (indices or UUIDs; nvidia-smi takes both), 0..N-1 when it is unset. On a host of
# one GPU model CUDA's numbering is nvidia-smi's (PCI bus order).
smi_ids() {
    local -a ids
    if [[ -n "${CUDA_VISIBLE_DEVICES:-}" ]]; then IFS=, read -ra ids <<<"$CUDA_VISIBLE_DEVICES"
    else read -ra ids <<<"$(seq -s ' ' 0 $(( $1 - 1 )))"; fi
    local IFS=,
    echo "${ids[*]:0:$1}"
}
