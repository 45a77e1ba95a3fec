"""The flows' names, by the attribute of flows.pipeline that holds each flow (a deployment's entrypoint,
`flows.pipeline:train_flow`): what `prefect deployment run FLOW/DEPLOYMENT` takes as FLOW.

A table without Prefect, so that run.sh's name check (flows.deployments) reads them without importing Prefect
and making every flow (~2.7 CPU-seconds before each run.sh); flows.pipeline names its flows from it.
"""

from __future__ import annotations

PIPELINE_FLOW = "gpt2-pretrain"  # every stage
SCAN_FLOW = "gpt2-evaluate"  # the scheduled evaluation of new checkpoints

STAGE_FLOWS = {  # attribute: (stage, flow name): one flow per stage
    "download_flow": ("download", "gpt2-download"), "tokenize_flow": ("tokenize", "gpt2-tokenize"),
    "hellaswag_flow": ("hellaswag", "gpt2-hellaswag"), "init_flow": ("init", "gpt2-init"),
    "train_flow": ("train", "gpt2-train"),
    "evaluate_final_flow": ("evaluate", "gpt2-evaluate-final"),  # not SCAN_FLOW: the final checkpoint's alone
    "sample_flow": ("sample", "gpt2-sample"), "export_flow": ("export", "gpt2-export"),
}

FLOW_NAMES = {"gpt2_pretrain": PIPELINE_FLOW, "gpt2_evaluate": SCAN_FLOW,
              **{attribute: name for attribute, (_, name) in STAGE_FLOWS.items()}}
