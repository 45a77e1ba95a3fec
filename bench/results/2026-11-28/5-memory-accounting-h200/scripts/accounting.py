"""The memory accounting table of docs/benchmarks.md from this folder's raw files (run here, no GPU):
call 1's context probe and call 2's runs of ours through bench.train_memory (new: the rounding straight into the
parameters; old: the commit before; x: new with PyTorch's allocator as it comes, expandable segments off)."""
import json
import sys
from pathlib import Path

MiB = 2**20
here = Path(__file__).resolve().parent.parent
probe = json.loads((here / "call1_probe.json").read_text())["stages"]
started = probe[0]
context = (started["nvml_device_used"] - started["reserved"]) / MiB  # nvidia-smi's figure less PyTorch's segment
print(f"CUDA context (a process that only started CUDA, nvidia-smi's figure less PyTorch's reserve): {context:.0f} MiB")
for a, b in zip(probe, probe[1:]):
    grew = ((b["nvml_device_used"] - b["reserved"]) - (a["nvml_device_used"] - a["reserved"])) / MiB
    print(f"  {b['stage']:<42} outside PyTorch +{grew:.0f} MiB, allocated {(b['allocated'] - a['allocated']) / MiB:+.0f}")

print("\n| run | torch allocated peak | reserved peak | allocator cache at the peak | context | libraries, kernels |"
      " cuBLAS workspaces (in allocated) | segments | alloc retries | nvidia-smi peak | gap | gap % |")
for name in sys.argv[1:] or ["n12", "o12", "x12", "n24a", "o24a", "x24", "n48", "o48", "x48"]:
    run = here / "call2" / name
    acct = json.loads(next(run.glob("run_*.memory.json")).read_text())
    smi = max(int(x) for x in next(run.glob("run_*.smi.log")).read_text().split() if x.isdigit())
    steady = next(r for r in acct["reports"] if r["where"] == "after optimizer_step 5")
    non_torch = (steady["nvml_device_used"] - steady["reserved"]) / MiB
    alloc, reserved = acct["allocated_peak"] / MiB, acct["reserved_peak"] / MiB
    segments = sum(p["segments"] for p in steady["pools"].values())
    gap = smi - alloc
    print(f"| {name} | {alloc:,.0f} | {reserved:,.0f} | {reserved - alloc:,.0f} | {context:,.0f} | {non_torch - context:,.0f} |"
          f" {acct['cublas_workspaces'] / MiB:,.0f} | {segments} | {steady['num_alloc_retries']} | {smi:,} | {gap:,.0f} |"
          f" {100 * gap / alloc:.1f}% |")
