"""Per-kernel GPU time per training step, from a torch-profiler trace (ours) or an ncu CSV (llm.c), and the
same grouped into kinds of work, so the two trainers' steps can be set side by side.

    python kernel_table.py torch TRACE.json.gz STEPS          # bench.profile_train's trace of STEPS steps
    python kernel_table.py ncu NCU.csv MICRO_STEPS            # ncu --csv of llm.c run with one micro-step a
                                                              # step: the kernels of its last training step,
                                                              # the forward/backward ones times MICRO_STEPS
"""

import csv
import gzip
import json
import re
import sys
from collections import defaultdict

KINDS = [  # (kind, pattern over the kernel name), first match wins
    ("attention", r"flash|sdpa|attn|cudnn|softmax|permute|unpermute"),
    ("optimizer", r"adamw|stochastic_round|multi_tensor_apply.*Adam|_fused_adam"),
    ("grad accumulation / norm / copies", r"multi_tensor_apply|global_norm|norm_kernel|reduce_kernel|copy|elementwise|FillFunctor|Memset|memset|Memcpy"),
    ("layernorm / residual", r"layernorm|residual|fused_residual"),
    ("gelu", r"gelu"),
    ("cross-entropy / classifier", r"classifier|cross_entropy|crossentropy|scaled_exp|logits"),
    ("embedding", r"encoder|embedding"),
    ("GEMM", r"gemm|nvjet|sm90_xmma|cutlass|cublas|Kernel2|matmul"),
]


def kind(name: str) -> str:
    for k, pattern in KINDS:
        if re.search(pattern, name, re.I):
            return k
    return "other"


def torch_kernels(path: str, steps: int) -> dict[str, tuple[int, float]]:
    trace = json.load(gzip.open(path))
    out: dict[str, list] = defaultdict(lambda: [0, 0.0])
    for e in trace["traceEvents"]:
        if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and "dur" in e:
            out[e["name"]][0] += 1
            out[e["name"]][1] += e["dur"] / 1e3
    return {n: (c / steps, ms / steps) for n, (c, ms) in out.items()}


def ncu_kernels(path: str, micro_steps: int) -> dict[str, tuple[int, float]]:
    with open(path) as f:
        lines = f.read().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith('"ID"'))
    rows = [r for r in csv.DictReader(lines[start:]) if r["Metric Name"] == "gpu__time_duration.sum"]
    # the last training step: from the last forward (encoder) that an update (AdamW, one launch a parameter
    # tensor) follows, through that update's last launch; the validation forward after it is left out
    adam = [i for i, r in enumerate(rows) if "adamw" in r["Kernel Name"].lower()]
    start = max(i for i, r in enumerate(rows) if "encoder_forward" in r["Kernel Name"] and i < adam[-1])
    step = rows[start:adam[-1] + 1]
    out: dict[str, list] = defaultdict(lambda: [0, 0.0])
    for r in step:
        name = r["Kernel Name"]
        # the update and the gradient norm run once a step; the rest once a micro-step
        times = 1 if re.search(r"adamw|norm_squared|global_norm", name, re.I) else micro_steps
        unit = r["Metric Unit"]
        scale = {"nsecond": 1, "ns": 1, "usecond": 1e3, "us": 1e3, "msecond": 1e6, "ms": 1e6, "second": 1e9}
        ns = float(r["Metric Value"].replace(",", "")) * scale[unit]
        out[name][0] += times
        out[name][1] += times * ns / 1e6
    return dict(out)


def main() -> None:
    source, path, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    kernels = torch_kernels(path, n) if source == "torch" else ncu_kernels(path, n)
    total = sum(ms for _, ms in kernels.values())
    by_kind: dict[str, float] = defaultdict(float)
    for name, (_, ms) in kernels.items():
        by_kind[kind(name)] += ms
    print(f"kernel time per step {total:,.1f} ms ({source}, {path})")
    for k, ms in sorted(by_kind.items(), key=lambda kv: -kv[1]):
        print(f"  {k:<36} {ms:9.1f} ms  {100 * ms / total:5.1f}%")
    print(f"{'ms/step':>9} {'launches':>9}  kernel")
    for name, (count, ms) in sorted(kernels.items(), key=lambda kv: -kv[1][1])[:60]:
        print(f"{ms:9.2f} {count:9.0f}  {name[:160]}")


if __name__ == "__main__":
    main()
