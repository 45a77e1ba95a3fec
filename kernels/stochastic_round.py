"""Stochastic rounding of float32 to bfloat16 in one pass, the random bits drawn inside the kernel.

llm.c's `stochastic_rounding` (master weights, `-w 1`): an element's float32 pattern keeps its top 16 bits and
rounds away from zero, to the next bfloat16, when its low 16 bits exceed a uniform 16-bit random number; the
expectation is the element itself. `stochastic_round_bf16(x, random16)` is that formula in PyTorch, the
reference. The kernel draws element i's 16 bits from Philox keyed by (seed, offset + i), so it reads and writes
each element once: on d12's 124M weights the rounding took 2.5 ms a step on an H200 with PyTorch ops
materialising the random numbers and the intermediate patterns, and takes about 0.3 ms here.

    stochastic_round(x, seed, offset)     # (n,) float32 -> (n,) float32 holding bfloat16 values
    random16(n, seed, offset, device)     # the bits it uses, in [0, 65536)
    stochastic_round_bf16(x, random16)    # the reference, given the bits

The bits depend only on (seed, offset + i), so a buffer rounded in one launch or in pieces at their offsets
gives the same result. On CUDA they are Triton's Philox; elsewhere element offset + i of a torch generator's
stream seeded with `seed`, a different but equally deterministic sequence (Triton's interpreter would be far
too slow for the optimizer of a CPU run; the kernel tests run it directly).
"""

from __future__ import annotations

import torch

from kernels._triton import jit, tl, triton

BLOCK = 4096  # elements a program (8 warps)


def stochastic_round(x: torch.Tensor, seed: int, offset: int = 0) -> torch.Tensor:
    """`x` (1-D contiguous float32) stochastically rounded to bfloat16 values, returned as float32; element i
    rounds with the bits of (seed, offset + i). seed must fit in 32 bits, offset + x.numel() in 63."""
    _check(x.numel(), seed, offset)
    if x.dtype != torch.float32 or x.dim() != 1 or not x.is_contiguous():
        raise ValueError(f"stochastic_round takes a contiguous 1-D float32 tensor, got {x.dtype} "
                         f"of shape {tuple(x.shape)}")
    if x.is_cuda:
        return _round_triton(x, seed, offset)
    return stochastic_round_bf16(x, random16(x.numel(), seed, offset, x.device))


def random16(n: int, seed: int, offset: int, device: torch.device | str) -> torch.Tensor:
    """(n,) int32 in [0, 65536): the bits stochastic_round uses for elements offset..offset+n-1 on `device`."""
    _check(n, seed, offset)
    if torch.device(device).type == "cuda":
        return _random16_triton(n, seed, offset, device)
    # drawn from the start of the seed's stream, so the bits of an element do not depend on where a piece begins
    generator = torch.Generator(device).manual_seed(seed)
    return torch.randint(0, 1 << 16, (offset + n,), generator=generator, dtype=torch.int32, device=device)[offset:]


def stochastic_round_bf16(x: torch.Tensor, random16: torch.Tensor) -> torch.Tensor:
    """float32 `x` rounded to a bfloat16 value (returned as float32), up or down at random, unbiased.

    llm.c's `stochastic_rounding`: the low 16 bits of x's float32 pattern (the part bfloat16 drops) are
    compared with `random16` (int32, uniform in [0, 65536)); x rounds away from zero, to the next bfloat16,
    when they exceed it, so with probability low/65536, and towards zero otherwise. The expectation is x.
    Adding 1 << 16 to the truncated pattern is the step to the next bfloat16, carries into the exponent
    included.
    """
    bits = x.view(torch.int32)
    round_up = (bits & 0xFFFF) > random16
    rounded = (bits & ~0xFFFF).add_(round_up, alpha=1 << 16)  # in place on the truncated pattern: one temporary
    return rounded.view(torch.float32)


@jit
def _random16(seed, idx):
    return (tl.randint(seed, idx) & 0xFFFF).to(tl.int32)  # idx int64: Philox counts with 64 bits


@jit
def _stochastic_round_kernel(x_ptr, out_ptr, n, seed, offset, BLOCK: tl.constexpr):
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = i < n
    bits = tl.load(x_ptr + i, mask=mask, other=0.0).to(tl.int32, bitcast=True)
    round_up = (bits & 0xFFFF) > _random16(seed, offset + i)
    rounded = (bits & -65536) + tl.where(round_up, 65536, 0)  # -65536 is ~0xFFFF, 65536 the step to the next bf16
    tl.store(out_ptr + i, rounded.to(tl.float32, bitcast=True), mask=mask)


@jit
def _random16_kernel(out_ptr, n, seed, offset, BLOCK: tl.constexpr):
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + i, _random16(seed, offset + i), mask=i < n)


def _round_triton(x: torch.Tensor, seed: int, offset: int) -> torch.Tensor:
    out = torch.empty_like(x)
    _stochastic_round_kernel[(triton.cdiv(x.numel(), BLOCK),)](x, out, x.numel(), seed, offset, BLOCK=BLOCK,
                                                              num_warps=8)
    return out


def _random16_triton(n: int, seed: int, offset: int, device: torch.device | str) -> torch.Tensor:
    out = torch.empty(n, dtype=torch.int32, device=device)
    _random16_kernel[(triton.cdiv(n, BLOCK),)](out, n, seed, offset, BLOCK=BLOCK)
    return out


def _check(n: int, seed: int, offset: int) -> None:
    if not (0 <= seed < 2**32 and 0 <= offset and offset + n <= 2**63):
        raise ValueError(f"seed {seed} must lie in [0, 2**32) and elements {offset}..{offset + n} in [0, 2**63)")
