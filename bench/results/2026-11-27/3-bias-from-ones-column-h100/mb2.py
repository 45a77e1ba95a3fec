"""Stride-832 checks for the ones-column layout, and the dgelu GEMM's configs without dbias."""
import statistics, sys
import torch
import torch.nn.functional as F
sys.path[:0] = [".", __file__.rsplit("/", 1)[0]]
import kernels.mlp as mlp
from functools import partial
from timing import row as _row
row = partial(_row, width=60)
from kernels.linear import with_ones_column, augmented, matmul_out
from quack.gemm_config import GemmConfig


N, C, H = 65536, 768, 3072
bf = torch.bfloat16
g = torch.Generator(device="cuda").manual_seed(0)
h = torch.randn(N, C, device="cuda", dtype=bf, generator=g)
hp = with_ones_column(h)
print(torch.cuda.get_device_name(), "stride", hp.stride())
dy = torch.randn(N, C, device="cuda", dtype=bf, generator=g)
pre = torch.randn(N, H, device="cuda", dtype=bf, generator=g)
w_proj = 0.02 * torch.randn(C, H, device="cuda", dtype=bf, generator=g)
w_fc = 0.02 * torch.randn(H, C, device="cuda", dtype=bf, generator=g)
w_attn = 0.02 * torch.randn(3 * C, C, device="cuda", dtype=bf, generator=g)
b_fc = torch.zeros(H, device="cuda", dtype=bf)
q = mlp._load_quack()
row("gemm_act A contiguous", lambda: q.gemm_act(h, w_fc.t(), bias=b_fc, activation=mlp.GELU, store_preact=True, tuned=False))
row("gemm_act A stride 832", lambda: q.gemm_act(hp, w_fc.t(), bias=b_fc, activation=mlp.GELU, store_preact=True, tuned=False))
row("c_attn fwd contiguous", lambda: F.linear(h, w_attn))
row("c_attn fwd stride 832", lambda: F.linear(hp, w_attn))
dqkv = torch.randn(N, 3 * C, device="cuda", dtype=bf, generator=g)
row("c_attn dW contiguous (old)", lambda: matmul_out(dqkv.t(), h, torch.float32))
row("c_attn bias sum (old, eager)", lambda: dqkv.sum(0, dtype=torch.float32))
row("c_attn dW+db ones column stride 832 (new)", lambda: matmul_out(dqkv.t(), augmented(hp), torch.float32))
row("c_fc dW contiguous (old)", lambda: matmul_out(pre.t(), h, torch.float32))
row("c_fc dW+db ones column stride 832 (new)", lambda: matmul_out(pre.t(), augmented(hp), torch.float32))
D = torch.empty_like(pre); P = torch.empty_like(pre)
for name, cfg in (("pinned 128x128 pp c1x2", q.dgelu_config),
                  ("128x192 pp c2x1", GemmConfig(tile_m=128, tile_n=192, pingpong=True, cluster_m=2, cluster_n=1, is_dynamic_persistent=False, device_capacity=9)),
                  ("128x192 pp c1x2", GemmConfig(tile_m=128, tile_n=192, pingpong=True, cluster_m=1, cluster_n=2, is_dynamic_persistent=False, device_capacity=9)),
                  ("128x128 pp c2x1", GemmConfig(tile_m=128, tile_n=128, pingpong=True, cluster_m=2, cluster_n=1, is_dynamic_persistent=False, device_capacity=9)),
                  ("192x128 pp c1x2", GemmConfig(tile_m=192, tile_n=128, pingpong=True, cluster_m=1, cluster_n=2, is_dynamic_persistent=False, device_capacity=9))):
    row(f"[{name}] dgelu+postact", lambda cfg=cfg: q.dgelu(dy, w_proj, pre, out={"D": D, "postact": P}, config=cfg, dynamic_scheduler=True))
    row(f"[{name}] dgelu only", lambda cfg=cfg: q.dgelu_no_post(dy, w_proj, pre, out={"D": D}, config=cfg, dynamic_scheduler=True))
