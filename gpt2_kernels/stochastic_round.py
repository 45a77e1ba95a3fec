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
    plan = RoundInto(x, dests, starts)    # CUDA: where each destination's elements lie in x
    plan(seed, offset)                    # each dests[k] = stochastic_round(x, seed, offset)[starts[k]:...], in one
                                          # launch, with no result buffer in between

The bits depend only on (seed, offset + i), so a buffer rounded in one launch or in pieces at their offsets
gives the same result. On CUDA they are Triton's Philox; elsewhere element offset + i of a torch generator's
stream seeded with `seed`, a different but equally deterministic sequence (Triton's interpreter would be far
too slow for the optimizer of a CPU run; the kernel tests run it directly).
"""

from __future__ import annotations

import torch

from gpt2_kernels._triton import jit, tl, triton

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


class RoundInto:
    """x's slices rounded straight into separate destinations (on CUDA, one launch for all): destination k, a
    contiguous float32 tensor of n_k elements, gets `stochastic_round(x, seed, offset)[starts[k]:starts[k] + n_k]`,
    the same bits. The optimizer rounds its flat buffer of master weights into the parameters this way: no rounded
    copy of the buffer is made (at 1.5B weights a piece of it stayed cached in PyTorch's allocator, up to 322 MB),
    and each element is read once and written once instead of twice each.

    The plan is a table of blocks of at most BLOCK elements, none across two destinations (where it starts in x,
    the address it goes to, how many elements), built once on the host and kept on x's device: 20 bytes a block,
    7.6 MB at 1.5B weights. It holds the destinations' addresses, so they must stay where they are: `matches`
    says whether a plan was made for these destinations at these places."""

    def __init__(self, x: torch.Tensor, dests: list[torch.Tensor], starts: list[int]):
        if x.dtype != torch.float32 or x.dim() != 1 or not x.is_contiguous():
            raise ValueError(f"RoundInto rounds a contiguous 1-D float32 tensor, got {x.dtype} "
                             f"of shape {tuple(x.shape)}")
        for dest, start in zip(dests, starts, strict=True):
            if dest.dtype != torch.float32 or not dest.is_contiguous() or dest.device != x.device:
                raise ValueError(f"destinations must be contiguous float32 tensors on {x.device}, got {dest.dtype} "
                                 f"on {dest.device}")
            if not 0 <= start <= start + dest.numel() <= x.numel():
                raise ValueError(f"a destination of {dest.numel()} elements at {start} lies outside x's {x.numel()}")
        self.x, self.key = x, self._key(x, dests, starts)
        sizes = torch.tensor([d.numel() for d in dests], dtype=torch.int64)
        blocks = (sizes + BLOCK - 1) // BLOCK  # per destination
        owner = torch.repeat_interleave(torch.arange(len(dests)), blocks)
        first = torch.cumsum(blocks, 0) - blocks  # each destination's first block
        within = (torch.arange(int(blocks.sum())) - first[owner]) * BLOCK  # a block's first element in its destination
        self.src = (torch.tensor(starts, dtype=torch.int64)[owner] + within).to(x.device)
        self.dst = (torch.tensor([d.data_ptr() for d in dests], dtype=torch.int64)[owner] + 4 * within).to(x.device)
        self.count = torch.minimum(sizes[owner] - within, torch.tensor(BLOCK)).to(torch.int32).to(x.device)

    @staticmethod
    def _key(x: torch.Tensor, dests: list[torch.Tensor], starts: list[int]) -> tuple:
        return (x.data_ptr(), x.numel(), *((d.data_ptr(), d.numel(), s) for d, s in zip(dests, starts)))

    def matches(self, x: torch.Tensor, dests: list[torch.Tensor], starts: list[int]) -> bool:
        return self.key == self._key(x, dests, starts)

    def __call__(self, seed: int, offset: int = 0) -> None:
        _check(self.x.numel(), seed, offset)
        if self.src.numel():
            _stochastic_round_into_kernel[(self.src.numel(),)](self.x, self.src, self.dst, self.count, seed, offset,
                                                              BLOCK=BLOCK, num_warps=8)


@jit
def _stochastic_round_into_kernel(x_ptr, src_ptr, dst_ptr, count_ptr, seed, offset, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    src = tl.load(src_ptr + pid)  # int64: the block's first element in x
    dst = tl.load(dst_ptr + pid).to(tl.pointer_type(tl.float32))  # where that element goes
    i = tl.arange(0, BLOCK)
    mask = i < tl.load(count_ptr + pid)
    bits = tl.load(x_ptr + src + i, mask=mask, other=0.0).to(tl.int32, bitcast=True)
    round_up = (bits & 0xFFFF) > _random16(seed, offset + src + i)
    rounded = (bits & -65536) + tl.where(round_up, 65536, 0)
    tl.store(dst + i, rounded.to(tl.float32, bitcast=True), mask=mask)


def _random16_triton(n: int, seed: int, offset: int, device: torch.device | str) -> torch.Tensor:
    out = torch.empty(n, dtype=torch.int32, device=device)
    _random16_kernel[(triton.cdiv(n, BLOCK),)](out, n, seed, offset, BLOCK=BLOCK)
    return out


def _check(n: int, seed: int, offset: int) -> None:
    if not (0 <= seed < 2**32 and 0 <= offset and offset + n <= 2**63):
        raise ValueError(f"seed {seed} must lie in [0, 2**32) and elements {offset}..{offset + n} in [0, 2**63)")
