"""Microbench: where the MLP backward GEMM's time goes, and the cost of bias grads via a ones column."""
import statistics, sys, traceback
import torch
import torch.nn.functional as F

sys.path[:0] = [".", __file__.rsplit("/", 1)[0]]
import kernels.mlp as mlp
from timing import row
from quack.gemm_config import GemmConfig
from quack.activation import dgelu_tanh_approx
from quack.epilogue.frontend import gemm_epilogue
from quack.epilogue.ops import RowVecReduce
from quack.gemm_interface import gemm as quack_gemm

torch.backends.cuda.matmul.allow_tf32 = True


N, C, H = 65536, 768, 3072
g = torch.Generator(device="cuda").manual_seed(0)
bf = torch.bfloat16
dy = torch.randn(N, C, device="cuda", dtype=bf, generator=g)
h = torch.randn(N, C, device="cuda", dtype=bf, generator=g)
pre = torch.randn(N, H, device="cuda", dtype=bf, generator=g)
w_proj = 0.02 * torch.randn(C, H, device="cuda", dtype=bf, generator=g)
w_fc = 0.02 * torch.randn(H, C, device="cuda", dtype=bf, generator=g)
b_fc = torch.zeros(H, device="cuda", dtype=bf)
q = mlp._load_quack()
print(torch.cuda.get_device_name(), torch.__version__)


@gemm_epilogue()
def dgelu_only(acc, c):
    dx, _ = dgelu_tanh_approx(c, acc)
    return {"D": dx}


@gemm_epilogue(outputs=("postact",))
def dgelu_post(acc, c):
    dx, out = dgelu_tanh_approx(c, acc)
    return {"D": dx, "postact": out}


@gemm_epilogue(reduces={"dbias": RowVecReduce("dbias")})
def add_c_dbias(acc, c):
    return {"D": acc + c, "dbias": acc}


@gemm_epilogue()
def add_c(acc, c):
    return {"D": acc + c}


D = torch.empty_like(pre); P = torch.empty_like(pre)
configs = {
    "pinned 128x128 pp c1x2": q.dgelu_dbias_config,
    "128x192 pp c2x1": GemmConfig(tile_m=128, tile_n=192, pingpong=True, cluster_m=2, cluster_n=1, is_dynamic_persistent=False, device_capacity=9),
    "128x256 coop c2x1": GemmConfig(tile_m=128, tile_n=256, pingpong=False, cluster_m=2, cluster_n=1, is_dynamic_persistent=False, device_capacity=9),
    "256x128 coop c1x2": GemmConfig(tile_m=256, tile_n=128, pingpong=False, cluster_m=1, cluster_n=2, is_dynamic_persistent=False, device_capacity=9),
}
for cname, cfg in configs.items():
    row(f"[{cname}] dgelu+dbias+postact (now)", lambda cfg=cfg: q.dgelu_dbias(dy, w_proj, pre, out={"D": D, "postact": P}, config=cfg, dynamic_scheduler=True))
    row(f"[{cname}] dgelu+dbias no post (now, kept)", lambda cfg=cfg: q.dgelu_dbias_no_post(dy, w_proj, pre, out={"D": D}, config=cfg, dynamic_scheduler=True))
    row(f"[{cname}] dgelu+postact no dbias", lambda cfg=cfg: dgelu_post(dy, w_proj, pre, out={"D": D, "postact": P}, config=cfg, dynamic_scheduler=True))
    row(f"[{cname}] dgelu only", lambda cfg=cfg: dgelu_only(dy, w_proj, pre, out={"D": D}, config=cfg, dynamic_scheduler=True))
    row(f"[{cname}] D=acc+C, dbias", lambda cfg=cfg: add_c_dbias(dy, w_proj, pre, out={"D": D}, config=cfg, dynamic_scheduler=True))
    row(f"[{cname}] D=acc+C", lambda cfg=cfg: add_c(dy, w_proj, pre, out={"D": D}, config=cfg, dynamic_scheduler=True))
row("quack gemm plain D=dy@w_proj (default cfg)", lambda: quack_gemm(dy, w_proj, out=D))
row("cuBLAS mm dy@w_proj", lambda: torch.mm(dy, w_proj, out=D))
row("gemm_act fwd (now)", lambda: q.gemm_act(h, w_fc.t(), bias=b_fc, activation=mlp.GELU, store_preact=True, tuned=False))

# bias gradients through a ones column of the LayerNorm output
h_aug = torch.zeros(N, C + 8, device="cuda", dtype=bf); h_aug[:, :C] = h; h_aug[:, C] = 1
for name, width in (("c_attn", 3 * C), ("c_fc", H)):
    dout = torch.randn(N, width, device="cuda", dtype=bf, generator=g)
    out776 = torch.empty(width, C + 8, device="cuda", dtype=torch.float32)
    row(f"{name} dW = doutT h fp32 (now)", lambda: torch.mm(dout.t(), h, out_dtype=torch.float32))
    row(f"{name} dW bf16 (inductor's)", lambda: torch.mm(dout.t(), h))
    row(f"{name} bias sum eager fp32", lambda: dout.sum(0, dtype=torch.float32))
    csum = torch.compile(lambda t: t.float().sum(0))
    row(f"{name} bias sum compiled", lambda: csum(dout))
    row(f"{name} dW_aug 769 (new alloc)", lambda: torch.mm(dout.t(), h_aug[:, :C + 1], out_dtype=torch.float32))
    row(f"{name} dW_aug 776 (new alloc)", lambda: torch.mm(dout.t(), h_aug, out_dtype=torch.float32))
    row(f"{name} dW_aug 776 out=", lambda: torch.mm(dout.t(), h_aug, out_dtype=torch.float32, out=out776))
    row(f"{name} dW_aug 769 out= view", lambda: torch.mm(dout.t(), h_aug[:, :C + 1], out_dtype=torch.float32, out=out776[:, :C + 1]))
    ref = torch.mm(dout.t(), h_aug, out_dtype=torch.float32)
    err = ((ref[:, C] - dout.float().sum(0)).norm() / dout.float().sum(0).norm()).item()
    print(f"{name} bias from ones column rel err vs fp32 sum {err:.2e}; dW err {((ref[:, :C] - torch.mm(dout.t(), h, out_dtype=torch.float32)).norm()).item():.2e}")
    w = 0.02 * torch.randn(width, C, device="cuda", dtype=bf, generator=g)
    row(f"{name} fwd linear(h)", lambda: F.linear(h, w))
    row(f"{name} fwd linear(h_aug[:, :C]) strided", lambda: F.linear(h_aug[:, :C], w))
    row(f"{name} dh = dout @ W", lambda: dout @ w)
row("gemm_act fwd A strided h_aug[:, :C]", lambda: q.gemm_act(h_aug[:, :C], w_fc.t(), bias=b_fc, activation=mlp.GELU, store_preact=True, tuned=False))
try:
    a1, _ = q.gemm_act(h_aug[:, :C], w_fc.t(), bias=b_fc, activation=mlp.GELU, store_preact=True, tuned=False)
    a2, _ = q.gemm_act(h, w_fc.t(), bias=b_fc, activation=mlp.GELU, store_preact=True, tuned=False)
    print("gemm_act strided equal:", torch.equal(a1, a2))
except Exception:
    traceback.print_exc()
