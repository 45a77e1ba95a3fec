"""gpt2_kernels.stochastic_round: the one-pass Triton rounding against the PyTorch formula given the same bits.

The kernel runs on CUDA, or on CPU through Triton's interpreter (tests/conftest.py), at sizes that are not
multiples of its block; its bits depend on (seed, offset + i) alone, so pieces rounded at their offsets equal
the whole. The formula itself is checked against hand computations in tests/test_train_master_weights.py.
"""

import pytest
import torch

from gpt2_kernels.stochastic_round import (
    BLOCK, RoundInto, _random16_triton, _round_triton, random16, stochastic_round, stochastic_round_bf16,
)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _masters(n: int, seed: int = 0) -> torch.Tensor:
    """Weights of GPT-2's scale with every low-16-bit pattern likely, and exact bf16 values among them."""
    x = 0.02 * torch.randn(n, generator=torch.Generator().manual_seed(seed))
    x[::7] = x[::7].to(torch.bfloat16).float()
    return x.to(DEVICE)


# offsets past 2**32 too: a model (or an optimizer shard) of more than 4.3 billion weights
@pytest.mark.parametrize("n, offset", [(1, 0), (BLOCK - 1, 0), (BLOCK + 3, 5), (3 * BLOCK + 17, 1 << 20), (BLOCK, (1 << 32) - 7)])
def test_kernel_is_the_formula_with_its_bits(n, offset):
    x = _masters(n)
    bits = _random16_triton(n, 1234, offset, DEVICE)
    assert bits.min() >= 0 and bits.max() < 1 << 16
    assert torch.equal(_round_triton(x, 1234, offset), stochastic_round_bf16(x, bits))


@pytest.mark.parametrize("start", [0, (1 << 32) - BLOCK])  # a piece that crosses 2**32 among them
def test_pieces_at_their_offsets_equal_the_whole(start):
    n, cut = 2 * BLOCK + 101, BLOCK + 50
    x = _masters(n)
    whole = _round_triton(x, 7, start)
    pieces = torch.cat([_round_triton(x[:cut].contiguous(), 7, start),
                        _round_triton(x[cut:].contiguous(), 7, start + cut)])
    assert torch.equal(whole, pieces)


@pytest.mark.parametrize("offset", [0, (1 << 32) - BLOCK])  # keys that cross 2**32 among them
def test_round_into_gives_each_destination_its_slice_of_the_whole(offset):
    """The optimizer's rounding straight into the parameters: each destination gets the bits of its slice of one
    launch over the whole buffer; destinations of any size (one element, not a multiple of the block), a slice
    that no destination takes (a parameter without a gradient), every element written (poisoned before)."""
    sizes, skipped = [1, BLOCK + 5, 7, 2 * BLOCK - 200, 64, 3], 4
    x = _masters(sum(sizes))
    starts = [sum(sizes[:k]) for k in range(len(sizes))]
    dests = [torch.full((n,), float("nan"), device=DEVICE) for k, n in enumerate(sizes) if k != skipped]
    dest_starts = [s for k, s in enumerate(starts) if k != skipped]
    plan = RoundInto(x, dests, dest_starts)
    plan(99, offset)
    whole = _round_triton(x, 99, offset)
    for dest, start in zip(dests, dest_starts):
        assert torch.equal(dest, whole[start:start + dest.numel()])
    assert plan.matches(x, dests, dest_starts) and not plan.matches(x, dests[:-1], dest_starts[:-1])
    assert not plan.matches(x, [torch.empty_like(d) for d in dests], dest_starts)  # other places: a new table


def test_round_into_refuses_what_it_cannot_write():
    x = torch.zeros(10)
    with pytest.raises(ValueError, match="lies outside"):
        RoundInto(x, [torch.zeros(4)], [8])
    with pytest.raises(ValueError, match="contiguous float32"):
        RoundInto(x, [torch.zeros(4, dtype=torch.bfloat16)], [0])
    with pytest.raises(ValueError, match="contiguous float32"):
        RoundInto(x, [torch.zeros(4, 2).t()], [0])


def test_bits_are_uniform_and_keyed_by_seed_and_index():
    n = 1 << 16
    bits = _random16_triton(n, 99, 0, DEVICE).double()
    stderr = (65536**2 / 12 / n) ** 0.5
    assert abs(bits.mean().item() - 32767.5) < 5 * stderr
    assert abs((bits < 32768).double().mean().item() - 0.5) < 5 * 0.5 / n**0.5
    assert not torch.equal(_random16_triton(64, 99, 0, DEVICE), _random16_triton(64, 100, 0, DEVICE))
    assert not torch.equal(_random16_triton(64, 99, 0, DEVICE), _random16_triton(64, 99, 64, DEVICE))


def test_public_function_uses_the_bits_random16_gives_on_its_device():
    """On CUDA the kernel; on the CPU (no interpreter in the optimizer) the formula with a torch generator's bits."""
    x = _masters(BLOCK + 9)
    assert torch.equal(stochastic_round(x, 5, 3), stochastic_round_bf16(x, random16(x.numel(), 5, 3, x.device)))


def test_refuses_what_it_cannot_round():
    with pytest.raises(ValueError, match="contiguous 1-D float32"):
        stochastic_round(torch.zeros(4, 4), 0)
    with pytest.raises(ValueError, match="contiguous 1-D float32"):
        stochastic_round(torch.zeros(8, dtype=torch.bfloat16), 0)
    with pytest.raises(ValueError, match=r"seed 4294967296 must lie in \[0, 2\*\*32\)"):
        stochastic_round(torch.zeros(8), 1 << 32)


@pytest.mark.gpu
def test_on_gpu_allocates_only_its_output():
    """d12's 124M weights round in one launch at the step's memory peak: the float32 result is all it holds
    (the PyTorch ops it replaced held the random numbers and intermediate patterns too)."""
    n = 1 << 24
    x = torch.randn(n, device="cuda")
    stochastic_round(x, 1, 0)  # compile the kernel before measuring
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    rounded = stochastic_round(x, 2, 0)
    torch.cuda.synchronize()
    assert torch.cuda.max_memory_allocated() - before <= 4 * n
    assert torch.equal(rounded, stochastic_round_bf16(x, random16(n, 2, 0, "cuda")))
