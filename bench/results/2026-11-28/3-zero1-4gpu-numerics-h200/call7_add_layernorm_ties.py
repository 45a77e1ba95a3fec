# the fused add+LayerNorm on CUDA: how far a tiny c_proj bias moves the bf16 residual's mean
import torch
from kernels.layernorm import add_layernorm, use_triton
torch.manual_seed(0)
x = (torch.randn(4096, 768, device="cuda") * 0.3).bfloat16()
y = (torch.randn(4096, 768, device="cuda") * 0.02).bfloat16()
w, b = torch.ones(768, device="cuda"), torch.zeros(768, device="cuda")
print(torch.cuda.get_device_name(), torch.__version__, "triton kernel:", use_triton(x))
base, _ = add_layernorm(x, y, w, b, out_dtype=torch.bfloat16)
for bias in (1e-7, 8.6e-7, 1e-5):
    moved, _ = add_layernorm(x, y, w, b, out_dtype=torch.bfloat16, y_bias=torch.full((768,), bias, device="cuda"))
    print(f"y_bias {bias:.1e}: residual mean moved {(moved.float() - base.float()).mean().item():.2e}")
