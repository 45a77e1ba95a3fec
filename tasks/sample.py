"""The sample stage: text continuations of a prompt from a checkpoint (`python -m gpt2.sample`)."""

from __future__ import annotations

from dataclasses import dataclass

from prefect import task
from prefect.artifacts import create_markdown_artifact

from common.files import read_json
from gpt2.run_dir import RunDir
from tasks.cache import FileRef, StageCache, StageRecord
from tasks.common import log_lines, python_module, run_artifact_key, writing
from tasks.init import MODEL_CODE, CheckpointRecord
from tasks.launch import run_streaming
from tasks.retry import best_effort

# modules whose source determines the stage's output (their edits invalidate its cache)
SAMPLE_CODE = MODEL_CODE + ("gpt2.sample",)  # entry modules; their imports count too


@dataclass(frozen=True)
class SampleRecord(StageRecord):
    samples: tuple[str, ...]


@task(name="sample", cache_policy=StageCache(stage="sample", code=SAMPLE_CODE), persist_result=True)
def sample(checkpoint: CheckpointRecord, prompt: str, num_samples: int, max_new_tokens: int, seed: int,
           device: str = "auto") -> SampleRecord:
    """Text continuations of `prompt` from a checkpoint (`python -m gpt2.sample`), into the run's samples/ folder
    as JSON and a markdown artifact."""
    path = RunDir(checkpoint.run_dir).sample(checkpoint.step)
    args = ["--checkpoint", checkpoint.path, "--prompt", prompt, "--num-samples", str(num_samples),
            "--max-new-tokens", str(max_new_tokens), "--seed", str(seed), "--device", device, "--out", str(path)]
    with writing(path.parent):  # two runs sampling the same checkpoint at once write its file one after the other
        run_streaming(python_module("gpt2.sample", args), log_lines())
        samples = tuple(read_json(path)["samples"])
    text = "\n\n".join(f"**sample {i}**\n\n> {s}" for i, s in enumerate(samples))
    best_effort("the samples artifact", create_markdown_artifact, f"# Samples at step {checkpoint.step}\n\n{text}\n",
                key=run_artifact_key("samples", checkpoint.run_dir))
    return SampleRecord(files=(FileRef.of(path),), samples=samples)
