"""LayerNorm microbenchmark (d12 training shapes): where the add+LayerNorm backward and forward stand against
memory bandwidth, and variants: programs per SM, a prefetching backward, the partial-sum reduction, the
forward's warps and rows per program."""
import sys

import torch
import triton
import triton.language as tl
from triton.testing import do_bench

import kernels.layernorm as ln
from kernels._triton import next_power_of_2, num_sms
from kernels.linear import ONES_COLUMNS, padded_width

torch.manual_seed(0)
dev = torch.device("cuda")
N, C = 65536, 768
BW = None


def bench(fn, label, nbytes):
    ms = do_bench(fn, warmup=25, rep=200)
    print(f"{label:60s} {ms * 1e3:8.1f} us  {nbytes / ms / 1e9:6.2f} TB/s", flush=True)
    return ms


@triton.jit
def _bwd_prefetch(z_ptr, w_ptr, mean_ptr, rstd_ptr, dout_ptr, dres_ptr, dx_ptr, partial_ptr, n_rows,
                  C: tl.constexpr, ROWS_PER_PROGRAM: tl.constexpr, HAS_Y_BIAS: tl.constexpr,
                  BLOCK_C: tl.constexpr):
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_C)
    col_mask = cols < C
    w = tl.load(w_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
    dw = tl.zeros([BLOCK_C], dtype=tl.float32)
    db = tl.zeros([BLOCK_C], dtype=tl.float32)
    dyb = tl.zeros([BLOCK_C], dtype=tl.float32)
    first = pid.to(tl.int64) * ROWS_PER_PROGRAM
    m = col_mask & (first < n_rows)
    z_n = tl.load(z_ptr + first * C + cols, mask=m, other=0.0)
    dout_n = tl.load(dout_ptr + first * C + cols, mask=m, other=0.0)
    dres_n = tl.load(dres_ptr + first * C + cols, mask=m, other=0.0)
    mean_n = tl.load(mean_ptr + first, mask=first < n_rows, other=0.0)
    rstd_n = tl.load(rstd_ptr + first, mask=first < n_rows, other=0.0)
    for i in range(ROWS_PER_PROGRAM):
        row = first + i
        z, dout, dres, mean, rstd = z_n.to(tl.float32), dout_n.to(tl.float32), dres_n.to(tl.float32), mean_n, rstd_n
        nxt = row + 1
        nvalid = (i + 1 < ROWS_PER_PROGRAM) & (nxt < n_rows)
        nm = col_mask & nvalid
        z_n = tl.load(z_ptr + nxt * C + cols, mask=nm, other=0.0)
        dout_n = tl.load(dout_ptr + nxt * C + cols, mask=nm, other=0.0)
        dres_n = tl.load(dres_ptr + nxt * C + cols, mask=nm, other=0.0)
        mean_n = tl.load(mean_ptr + nxt, mask=nvalid, other=0.0)
        rstd_n = tl.load(rstd_ptr + nxt, mask=nvalid, other=0.0)
        mask = col_mask & (row < n_rows)
        xhat = tl.where(mask, (z - mean) * rstd, 0.0)
        wdout = w * dout
        c1 = tl.sum(wdout, axis=0) / C
        c2 = tl.sum(wdout * xhat, axis=0) / C
        dz = rstd * (wdout - c1 - xhat * c2) + dres
        tl.store(dx_ptr + row * C + cols, dz.to(dx_ptr.dtype.element_ty), mask=mask)
        dw += dout * xhat
        db += dout
        if HAS_Y_BIAS:
            dyb += tl.where(mask, dz, 0.0)
    n_programs = tl.num_programs(0)
    tl.store(partial_ptr + pid * C + cols, dw, mask=col_mask)
    tl.store(partial_ptr + (n_programs + pid) * C + cols, db, mask=col_mask)
    if HAS_Y_BIAS:
        tl.store(partial_ptr + (2 * n_programs + pid) * C + cols, dyb, mask=col_mask)


@triton.jit
def _partial_sum(partial_ptr, out_ptr, P: tl.constexpr, C: tl.constexpr, BLOCK_P: tl.constexpr,
                 BLOCK_C: tl.constexpr):
    k = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    cm = cols < C
    acc = tl.zeros([BLOCK_P, BLOCK_C], dtype=tl.float32)
    for p0 in range(0, P, BLOCK_P):
        rows = p0 + tl.arange(0, BLOCK_P)
        acc += tl.load(partial_ptr + (k * P + rows[:, None]) * C + cols[None, :],
                       mask=(rows < P)[:, None] & cm[None, :], other=0.0)
    tl.store(out_ptr + k * C + cols, tl.sum(acc, axis=0), mask=cm)


@triton.jit
def _fwd_rows(x_ptr, y_ptr, y_bias_ptr, w_ptr, b_ptr, res_ptr, out_ptr, mean_ptr, rstd_ptr, eps, out_row_stride,
              n_rows, C: tl.constexpr, N_ONES_COLUMNS: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.arange(0, BLOCK_C)
    rm = rows < n_rows
    mask = rm[:, None] & (cols < C)[None, :]
    offs = rows[:, None] * C + cols[None, :]
    z = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    branch = tl.load(y_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    branch += tl.load(y_bias_ptr + cols, mask=cols < C, other=0.0).to(tl.float32)[None, :]
    z = (z + branch).to(res_ptr.dtype.element_ty)
    tl.store(res_ptr + offs, z, mask=mask)
    z = z.to(tl.float32)
    mean = tl.sum(z, axis=1) / C
    d = tl.where(mask, z - mean[:, None], 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(d * d, axis=1) / C + eps)
    w = tl.load(w_ptr + cols, mask=cols < C, other=0.0).to(tl.float32)[None, :]
    b = tl.load(b_ptr + cols, mask=cols < C, other=0.0).to(tl.float32)[None, :]
    out_rows = out_ptr + rows[:, None] * out_row_stride
    tl.store(out_rows + cols[None, :], (d * rstd[:, None] * w + b).to(out_ptr.dtype.element_ty), mask=mask)
    pad = tl.arange(0, N_ONES_COLUMNS)
    tl.store(out_rows + C + pad[None, :], tl.where(pad == 0, 1.0, 0.0)[None, :].to(out_ptr.dtype.element_ty),
             mask=rm[:, None])
    tl.store(mean_ptr + rows, mean, mask=rm)
    tl.store(rstd_ptr + rows, rstd, mask=rm)


def main():
    print(torch.cuda.get_device_name(), torch.__version__, triton.__version__, flush=True)
    sms = num_sms(dev)
    bf = torch.bfloat16
    z = torch.randn(N, C, device=dev, dtype=bf)
    w = torch.randn(C, device=dev) * 0.1 + 1
    b = torch.randn(C, device=dev) * 0.1
    mean = z.float().mean(1)
    rstd = torch.rsqrt(z.float().var(1, unbiased=False) + 1e-5)
    dout = torch.randn(N, C, device=dev, dtype=bf)
    dres = torch.randn(N, C, device=dev, dtype=bf)
    bwd_bytes = N * C * 2 * 4
    print("== backward: the op as it runs (kernel + partial.sum) ==")
    ref = ln.add_layernorm_backward(z, w, mean, rstd, dout, dres, bf, bf, True)
    for pps in (8, 16, 32):
        ln._BWD_PROGRAMS_PER_SM = pps
        for cfg in (dict(BLOCK_R=1, num_warps=1), dict(BLOCK_R=2, num_warps=1), dict(BLOCK_R=1, num_warps=2)):
            bench(lambda: ln.add_layernorm_backward(z, w, mean, rstd, dout, dres, bf, bf, True, config=cfg),
                  f"op  {pps:2d}/SM {cfg}", bwd_bytes)
    ln._BWD_PROGRAMS_PER_SM = 8
    print("== backward kernel alone / prefetching kernel / partial reductions ==")
    for pps in (4, 8, 16, 32):
        n_programs = min(N, pps * sms)
        rpp = -(-N // n_programs)
        n_programs = -(-N // rpp)
        dx = torch.empty_like(z)
        partial = torch.empty(3, n_programs, C, device=dev)
        meta = dict(C=C, ROWS_PER_PROGRAM=rpp, HAS_DRES=True, WRITE_DY=False, HAS_Y_BIAS=True, BLOCK_C=1024)
        bench(lambda: ln._add_layernorm_bwd_kernel[(n_programs,)](z, w, mean, rstd, dout, dres, dx, dx, partial, N,
                                                                 **meta, BLOCK_R=1, num_warps=1),
              f"kernel {pps:2d}/SM 1x1 ({n_programs} programs)", bwd_bytes)
        for warps in (1, 2):
            dx2 = torch.empty_like(z)
            partial2 = torch.empty_like(partial)
            fn = lambda: _bwd_prefetch[(n_programs,)](z, w, mean, rstd, dout, dres, dx2, partial2, N, C=C,
                                                      ROWS_PER_PROGRAM=rpp, HAS_Y_BIAS=True, BLOCK_C=1024,
                                                      num_warps=warps)
            bench(fn, f"prefetch {pps:2d}/SM {warps}w", bwd_bytes)
            fn()
            ln._add_layernorm_bwd_kernel[(n_programs,)](z, w, mean, rstd, dout, dres, dx, dx, partial, N, **meta,
                                                        BLOCK_R=1, num_warps=1)
            print("   dx equal:", torch.equal(dx, dx2), " partial max diff:", (partial - partial2).abs().max().item())
        bench(lambda: partial.sum(1), f"   torch partial.sum(1) (3, {n_programs}, C)", partial.numel() * 4)
        out = torch.empty(3, C, device=dev)
        for bp, bc in ((8, 64), (16, 32), (32, 32), (8, 32), (16, 64)):
            bench(lambda: _partial_sum[(3, triton.cdiv(C, bc))](partial, out, P=n_programs, C=C, BLOCK_P=bp,
                                                                BLOCK_C=bc, num_warps=4),
                  f"   triton partial sum BLOCK_P={bp} BLOCK_C={bc}", partial.numel() * 4)
        print("   sum diff:", (out - partial.sum(1)).abs().max().item())
    print("== forward (bf16 stream, y and y_bias, ones column) ==")
    x = torch.randn(N, C, device=dev, dtype=bf)
    y = torch.randn(N, C, device=dev, dtype=bf)
    yb = torch.randn(C, device=dev) * 0.1
    fwd_bytes = N * C * 2 * 3 + N * padded_width(C) * 2
    res, o = ln.add_layernorm(x, y, w, b, out_dtype=bf, y_bias=yb, ones_column=True)
    bench(lambda: ln.add_layernorm(x, y, w, b, out_dtype=bf, y_bias=yb, ones_column=True), "op (4 warps, 1 row)",
          fwd_bytes)
    res2 = torch.empty_like(x)
    out2 = torch.empty(N, padded_width(C), dtype=bf, device=dev)
    m2 = torch.empty(N, device=dev)
    r2 = torch.empty(N, device=dev)
    for warps in (1, 2, 4, 8):
        bench(lambda: ln._add_layernorm_fwd_kernel[(N,)](x, y, yb, w, b, res2, out2, out2, m2, r2, 1e-5,
                                                         padded_width(C), C=C, HAS_Y=True, HAS_Y_BIAS=True,
                                                         WRITE_COPY=False, ONES_COLUMN=True,
                                                         N_ONES_COLUMNS=ONES_COLUMNS, BLOCK_C=1024,
                                                         num_warps=warps),
              f"kernel 1 row, {warps} warps", fwd_bytes)
    for br, warps in ((2, 2), (2, 4), (4, 4), (4, 8), (8, 8), (2, 8), (1, 4)):
        fn = lambda: _fwd_rows[(triton.cdiv(N, br),)](x, y, yb, w, b, res2, out2, m2, r2, 1e-5, padded_width(C), N,
                                                       C=C, N_ONES_COLUMNS=ONES_COLUMNS, BLOCK_R=br, BLOCK_C=1024,
                                                       num_warps=warps)
        bench(fn, f"rows kernel {br} rows, {warps} warps", fwd_bytes)
        fn()
        print("   equal:", torch.equal(res2, res), torch.equal(out2[:, :C], o), torch.equal(out2[:, C:C + 8], o.as_strided((N, 8), (padded_width(C), 1), C)))


main()
