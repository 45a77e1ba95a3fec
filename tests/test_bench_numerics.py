"""bench/numerics.py's choices that need no GPU: the learning-rate schedule it trains each size with."""

from __future__ import annotations

import pytest

from bench.numerics import recipe_schedule
from gpt2.optim import lr_at


@pytest.mark.parametrize("descriptor, peak_lr", [("d12", 6e-4), ("d24", 3e-4), ("d36", 2.5e-4), ("d48", 6e-4)])
def test_each_size_trains_at_llmc_recipes_rate(descriptor, peak_lr):
    """llm.c's scripts/run_gpt2_{124M,350M,774M,1558M}.sh: these peak rates, each warmed up over 700 steps."""
    assert recipe_schedule(descriptor) == (peak_lr, 700)


def test_a_size_outside_the_recipes_gets_the_124m_schedule():
    assert recipe_schedule("d6") == recipe_schedule("gpt3:c768") == (6e-4, 700)


def test_the_checks_steps_are_the_first_of_the_recipes_warmup():
    """50 steps at d48 end at 50/700 of the peak, far below the rate that made the fp32 reference diverge (6e-4
    reached in 10 steps)."""
    lr, warmup = recipe_schedule("d48")
    assert lr_at(49, lr, 50, warmup_steps=warmup) == pytest.approx(6e-4 * 50 / 700)
