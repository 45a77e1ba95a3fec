import torch
from torch import Tensor

@torch.library.custom_op("exp::proj", mutates_args=())
def proj(h: Tensor, w: Tensor, grad_into: Tensor) -> Tensor:
    return h @ w.t()

@proj.register_fake
def _(h, w, grad_into):
    return h.new_empty(h.size(0), w.size(0))

@torch.library.custom_op("exp::proj_bwd", mutates_args=("grad_into",))
def proj_bwd(dy: Tensor, h: Tensor, w: Tensor, grad_into: Tensor) -> Tensor:
    grad_into.addmm_(dy.t(), h)
    return dy @ w

@proj_bwd.register_fake
def _(dy, h, w, grad_into):
    return h.new_empty(h.shape)

def setup(ctx, inputs, output):
    h, w, g = inputs
    ctx.save_for_backward(h, w); ctx.grad_into = g

def bwd(ctx, dy):
    (h, w), g = ctx.saved_tensors, ctx.grad_into
    return proj_bwd(dy, h, w, g), None, None

proj.register_autograd(bwd, setup_context=setup)

def f(x, w, g):
    return proj(x, w, g).sum()

w = torch.randn(8, 16, requires_grad=True)
buf = torch.zeros(8, 16)
for backend in ["eager-noncompiled", "aot_eager", "inductor"]:
    buf.zero_()
    fn = f if backend == "eager-noncompiled" else torch.compile(f, backend=backend, fullgraph=True)
    for i in range(2):
        x = torch.randn(5, 16, requires_grad=True, generator=torch.Generator().manual_seed(i))
        loss = fn(x, w, buf)
        gx, = torch.autograd.grad(loss, [x])
    ref = sum(torch.ones(5, 8).t() @ torch.randn(5, 16, generator=torch.Generator().manual_seed(i)) for i in range(2))
    print(backend, torch.allclose(buf, ref), w.grad)
