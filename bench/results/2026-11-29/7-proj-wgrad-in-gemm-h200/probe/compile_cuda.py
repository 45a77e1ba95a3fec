import torch, sys
src = open(".exp/probe/m3.py").read().split("def f(")[0]
exec(src)
def f(x, w1, w2, g1, g2):
    return proj(proj(x, w1, g1), w2, g2).sum()
dev = "cuda"
w1 = torch.randn(16, 16, requires_grad=True, device=dev); w2 = torch.randn(8, 16, requires_grad=True, device=dev)
flat = torch.zeros(16*16 + 8*16, device=dev)
g1, g2 = flat[:256].view(16, 16), flat[256:].view(8, 16)
for backend in ["eager", "aot_eager", "inductor"]:
    flat.zero_()
    fn = f if backend == "eager" else torch.compile(f, backend=backend, fullgraph=True)
    for i in range(2):
        x = torch.randn(5, 16, requires_grad=True, generator=torch.Generator().manual_seed(i)).to(dev)
        torch.autograd.grad(fn(x, w1, w2, g1, g2), [x])
    if backend == "eager": ref = flat.clone()
    print(backend, "same as eager:", torch.equal(flat, ref))
