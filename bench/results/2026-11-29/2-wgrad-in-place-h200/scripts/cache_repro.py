"""The compile-cache mix-up of call 2b on the CPU: fused add_layernorm -> biased_linear compiled with one
TORCHINDUCTOR_CACHE_DIR by the code before (PYTHONPATH=.exp/old, argument `old`), then by this tree with
torch's cache-key tag cleared (`untagged`) and as it is (`tagged`). Prints whether the backward ran."""
import sys
import torch
import torch.nn.functional as F
from kernels import add_layernorm, biased_linear

if sys.argv[1] == "untagged":
    torch.compiler.config.cache_key_tag = ""
N, C, out = 24, 16, 48
g = torch.Generator().manual_seed(2)
h, dy, w, b = (torch.randn(*s, generator=g) for s in ((N, C), (N, out), (out, C), (out,)))
ln_w, ln_b = torch.ones(C) * 1.5, torch.zeros(C) + 0.1

def fused(x, w, b):
    _, normed = add_layernorm(x, None, ln_w, ln_b, ones_column=True)
    return biased_linear(normed, w, b)

params = [t.clone().requires_grad_() for t in (h, w, b)]
try:
    torch.compile(fused, backend="inductor", fullgraph=True)(*params).backward(dy)
    print(sys.argv[1], "tag", repr(torch.compiler.config.cache_key_tag), "ran")
except AssertionError as e:
    print(sys.argv[1], "tag", repr(torch.compiler.config.cache_key_tag), "FAILED:", str(e).splitlines()[0][:90])
