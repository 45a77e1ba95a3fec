# does torch.addmm(out, a, b, out_dtype=fp32, out=out) accumulate a bf16 product into fp32 in place, bit for bit
# as torch.mm(a, b, out_dtype=fp32) then out.add_? and how long each takes, at d48's c_proj weight-gradient shapes
import torch
torch.manual_seed(0)
N = 16384
for C, K2 in ((1600, 1600), (1600, 6400)):
    dy = torch.randn(N, C, device="cuda", dtype=torch.bfloat16)
    h = torch.randn(N, K2, device="cuda", dtype=torch.bfloat16)
    base = torch.randn(C, K2, device="cuda")
    ref = base.clone(); ref.add_(torch.mm(dy.t(), h, out_dtype=torch.float32))
    got = base.clone()
    try:
        r = torch.addmm(got, dy.t(), h, out_dtype=torch.float32, out=got)
        print(C, K2, "addmm out_dtype ok; same object", r.data_ptr() == got.data_ptr(), "bitwise", torch.equal(got, ref),
              "max abs diff", (got - ref).abs().max().item())
    except Exception as e:
        print(C, K2, "addmm out_dtype failed:", type(e).__name__, str(e)[:300])
        continue
    # a strided view of a bigger flat buffer, as FlatGradients' views are
    flat = torch.zeros(C * K2 + 1024, device="cuda"); v = flat[512:512 + C * K2].view(C, K2); v.copy_(base)
    torch.addmm(v, dy.t(), h, out_dtype=torch.float32, out=v)
    print("  into a view of a flat buffer: bitwise", torch.equal(v, ref), "rest untouched", flat[:512].abs().sum().item() == 0)
    def t(fn, n=20):
        s, e = torch.cuda.Event(True), torch.cuda.Event(True)
        fn(); torch.cuda.synchronize(); s.record()
        for _ in range(n): fn()
        e.record(); torch.cuda.synchronize(); return s.elapsed_time(e) / n * 1000
    g2 = base.clone()
    print("  us: mm(out_dtype)+add_", round(t(lambda: g2.add_(torch.mm(dy.t(), h, out_dtype=torch.float32)))),
          "addmm in place", round(t(lambda: torch.addmm(g2, dy.t(), h, out_dtype=torch.float32, out=g2))),
          "mm alone", round(t(lambda: torch.mm(dy.t(), h, out_dtype=torch.float32))))
