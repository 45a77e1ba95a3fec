"""How fast a training step's GEMMs can run on this GPU, whatever the kernels around them do.

A step's matmuls are fixed by the model and the batch. Per layer and micro-step each of the block's four linear
layers (c_attn C→3C, attention's c_proj C→C, c_fc C→4C, the MLP's c_proj 4C→C) does a forward, an input-gradient
and a weight-gradient GEMM; the classifier (C→padded vocab) does the same three once. This replays exactly those
GEMMs through cuBLAS (`torch.mm`: bf16 in, bf16 out for the forward and input gradients, the weight gradients
added in fp32 into one buffer per layer, as the trainer accumulates them), every layer's own weights, back to back
from one CUDA graph, as many micro-steps as a step has. So the card runs them at the clock it holds under sustained
load, not at the higher clock of one GEMM timed alone, and with nothing else in the step: what it prints is a
floor for the step's GEMM time on this card through cuBLAS, to set beside the GEMM time `bench.profile_train`
measures inside the real step.

    python -m bench.gemm_ceiling --model d48 --batch-size 16 --total-batch 131072
    python -m bench.gemm_ceiling --model d48 --batch-size 16 --total-batch 131072 --streams 2

--streams 2 runs each layer's weight-gradient GEMMs on a second stream beside the input-gradient chain (the most
that overlapping them could gain for the GEMMs alone). The report gives ms a step, TFLOP/s, the GPU, its SM clock
and power draw sampled while the graph replays (NVML, when nvidia-ml-py is there), and the versions.
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import sys
import threading
from dataclasses import dataclass

import torch

from bench.train_memory import nvml_uuid
from common.files import write_json
from gpt2.config import GPTConfig


@dataclass(frozen=True)
class Linear:
    """One linear layer's matmul: rows × fan_in → rows × fan_out."""

    name: str
    fan_in: int
    fan_out: int

    def flops(self, rows: int) -> int:
        """Forward, input gradient and weight gradient: three GEMMs of 2·rows·fan_in·fan_out each."""
        return 3 * 2 * rows * self.fan_in * self.fan_out


def block_linears(config: GPTConfig) -> list[Linear]:
    C = config.n_embd
    return [Linear("c_attn", C, 3 * C), Linear("attn.c_proj", C, C), Linear("c_fc", C, 4 * C),
            Linear("mlp.c_proj", 4 * C, C)]


def step_flops(config: GPTConfig, rows: int, micro_steps: int) -> int:
    """The GEMM FLOPs of one optimizer step: every block's four layers and the classifier, three GEMMs each."""
    classifier = Linear("lm_head", config.n_embd, config.padded_vocab_size)
    per_micro = config.n_layer * sum(lin.flops(rows) for lin in block_linears(config)) + classifier.flops(rows)
    return micro_steps * per_micro


class LayerGemms:
    """One layer's operands, its own weights and fp32 weight-gradient buffer, and its three GEMMs."""

    def __init__(self, lin: Linear, x: torch.Tensor, dy: torch.Tensor):
        self.weight = 0.02 * torch.randn(lin.fan_out, lin.fan_in, device="cuda", dtype=torch.bfloat16)
        self.weight_grad = torch.zeros(lin.fan_out, lin.fan_in, device="cuda", dtype=torch.float32)
        self.x, self.dy = x, dy  # (rows, fan_in), (rows, fan_out): shared across layers, as activations recycle

    def forward(self) -> None:
        torch.mm(self.x, self.weight.t())  # (rows, fan_out)

    def input_grad(self) -> None:
        torch.mm(self.dy, self.weight)  # (rows, fan_in)

    def weight_grad_gemm(self) -> None:
        torch.addmm(self.weight_grad, self.dy.t(), self.x, out_dtype=torch.float32, out=self.weight_grad)


def build_layers(config: GPTConfig, rows: int) -> tuple[list[list[LayerGemms]], LayerGemms]:
    """Per block its four layers' GEMMs, and the classifier's; activations shared by shape."""
    acts: dict[int, torch.Tensor] = {}

    def act(width: int) -> torch.Tensor:
        if width not in acts:
            acts[width] = torch.randn(rows, width, device="cuda", dtype=torch.bfloat16)
        return acts[width]

    blocks = [[LayerGemms(lin, act(lin.fan_in), act(lin.fan_out)) for lin in block_linears(config)]
              for _ in range(config.n_layer)]
    vocab = config.padded_vocab_size
    classifier = LayerGemms(Linear("lm_head", config.n_embd, vocab), act(config.n_embd), act(vocab))
    return blocks, classifier


def micro_step(blocks: list[list[LayerGemms]], classifier: LayerGemms, side: torch.cuda.Stream | None) -> None:
    """The forward GEMMs layer by layer, then the backward's in reverse; with `side`, the weight gradients there."""
    for block in blocks:
        for layer in block:
            layer.forward()
    classifier.forward()
    main = torch.cuda.current_stream()
    for layer in [classifier] + [layer for block in reversed(blocks) for layer in reversed(block)]:
        layer.input_grad()
        if side is None:
            layer.weight_grad_gemm()
            continue
        side.wait_stream(main)  # dy of this layer is ready
        with torch.cuda.stream(side):
            layer.weight_grad_gemm()
    if side is not None:
        main.wait_stream(side)  # the graph joins its fork


class Sampler:
    """SM clock (MHz) and power (W) every 50 ms through NVML, while the replays run; empty without nvidia-ml-py."""

    def __init__(self):
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml = pynvml
            self._handle = pynvml.nvmlDeviceGetHandleByUUID(nvml_uuid(None).encode())  # CUDA's index is not NVML's
        except Exception:  # noqa: BLE001  (no nvidia-ml-py, or NVML not answering: report without clocks)
            self._nvml = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while self._nvml and not self._stop.wait(0.05):
            clock = self._nvml.nvmlDeviceGetClockInfo(self._handle, self._nvml.NVML_CLOCK_SM)
            power = self._nvml.nvmlDeviceGetPowerUsage(self._handle) / 1000
            self.samples.append((clock, power))

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def summary(self) -> dict:
        if not self.samples:
            return {}
        clocks, powers = zip(*self.samples)
        return {"sm_clock_mhz_median": statistics.median(clocks), "power_w_median": statistics.median(powers),
                "samples": len(self.samples)}


def measure(config: GPTConfig, rows: int, micro_steps: int, streams: int, steps: int) -> dict:
    blocks, classifier = build_layers(config, rows)
    side = torch.cuda.Stream() if streams == 2 else None
    warm = torch.cuda.Stream()
    warm.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(warm):  # cuBLAS picks its kernels and workspaces outside the capture
        micro_step(blocks, classifier, side)
    torch.cuda.current_stream().wait_stream(warm)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        micro_step(blocks, classifier, side)
    for _ in range(micro_steps):  # warm the clocks to their sustained level before timing
        graph.replay()
    torch.cuda.synchronize()
    times = []
    with Sampler() as sampler:
        for _ in range(steps):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(micro_steps):
                graph.replay()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
    ms = statistics.median(times)
    flops = step_flops(config, rows, micro_steps)
    return {"streams": streams, "ms_per_step": round(ms, 2), "ms_min": round(min(times), 2),
            "ms_max": round(max(times), 2), "tflops": round(flops / ms / 1e9, 1), **sampler.summary()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.gemm_ceiling", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="d12", help="llm.c descriptor: d12, d24, d36, d48 (default d12)")
    parser.add_argument("--batch-size", type=int, default=64, help="micro-batch, sequences (default 64)")
    parser.add_argument("--seq-len", type=int, default=1024, help="tokens a sequence (default 1024)")
    parser.add_argument("--total-batch", type=int, default=524288, help="tokens an optimizer step (default 524288)")
    parser.add_argument("--streams", type=int, nargs="+", choices=(1, 2), default=[1],
                        help="1: every GEMM on one stream; 2: weight gradients on a second (default 1)")
    parser.add_argument("--steps", type=int, default=5, help="timed steps, after one untimed (default 5)")
    parser.add_argument("--json", help="also write the report to this file")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.error("needs a CUDA GPU: it times the GPU's GEMMs")
    rows = args.batch_size * args.seq_len
    if args.total_batch % rows:
        parser.error(f"--total-batch {args.total_batch} is not a multiple of batch-size × seq-len = {rows}")
    config = GPTConfig.from_descriptor(args.model)
    micro_steps = args.total_batch // rows
    report = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "cuda": torch.version.cuda,
              "model": args.model, "rows": rows, "micro_steps": micro_steps,
              "gemm_tflop_a_step": round(step_flops(config, rows, micro_steps) / 1e12, 2),
              "runs": [measure(config, rows, micro_steps, streams, args.steps) for streams in args.streams]}
    for run in report["runs"]:
        clocks = (f", SM {run['sm_clock_mhz_median']:.0f} MHz, {run['power_w_median']:.0f} W"
                  if "power_w_median" in run else "")
        print(f"{args.model} {rows} rows × {micro_steps} micro-steps, {run['streams']} stream(s): "
              f"{run['ms_per_step']:.1f} ms a step ({run['ms_min']:.1f}-{run['ms_max']:.1f}), "
              f"{run['tflops']:.0f} TFLOP/s{clocks} [{report['gpu']}, torch {report['torch']}, {report['date']}]",
              flush=True)
    if args.json:
        write_json(args.json, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
