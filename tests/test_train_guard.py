"""Outlier guard: rolling z-scores, skipping, aborting; non-finite losses never reach the weights."""

import math

import numpy as np
import pytest
import torch

from gpt2.guard import OutlierGuard, RollingZScore, TrainingDivergedError
from gpt2.train import train
from tests.fixtures.train.tiny import single_thread  # noqa: F401 (autouse fixture)
from tests.fixtures.train.tiny import final_params, read_metrics, tiny_config


def test_zscore_matches_numpy_over_the_last_window():
    rng = np.random.default_rng(0)
    values = rng.normal(3.0, 0.5, size=300)
    stats = RollingZScore(window=128)
    for i, v in enumerate(values):
        z = stats.zscore(v)
        if i < 128:
            assert math.isnan(z)  # not enough history yet
        else:
            window = values[i - 128 : i]
            assert z == pytest.approx((v - window.mean()) / window.std(), rel=1e-9)
        stats.add(v)


def _warm_guard(**kwargs) -> OutlierGuard:
    guard = OutlierGuard(window=8, **kwargs)
    for i in range(8):
        assert not guard.check(3.0 + 0.01 * (i % 2), 1.0 + 0.01 * (i % 2)).skip
    return guard


def test_threshold_skips_outliers_and_keeps_them_out_of_the_statistics():
    guard = _warm_guard(loss_z=5.0, norm_z=5.0)
    history = list(guard.loss_stats.values)
    decision = guard.check(4.0, 1.0)  # mean 3.005, std 0.005: z = 0.995 / 0.005 = 199
    assert decision.skip and "loss z-score" in decision.reason and decision.loss_z == pytest.approx(199.0)
    assert list(guard.loss_stats.values) == history
    assert guard.check(3.0, 9.0).skip  # grad norm outlier
    assert not guard.check(3.0, 1.0).skip


def test_threshold_zero_disables_z_skipping_but_not_nan_skipping():
    guard = _warm_guard()
    assert not guard.check(100.0, 100.0).skip
    for bad in (math.nan, math.inf):
        assert guard.check(bad, 1.0).skip
        assert guard.check(3.0, bad).skip


def test_aborts_after_max_bad_steps_in_a_row():
    guard = OutlierGuard(window=8, max_bad_steps=3)
    guard.check(math.nan, 1.0)
    guard.check(math.nan, 1.0)
    guard.check(3.0, 1.0)  # a good step resets the count
    guard.check(math.nan, 1.0)
    guard.check(math.nan, 1.0)
    with pytest.raises(TrainingDivergedError, match="3 steps in a row"):
        guard.check(math.nan, 1.0)


def test_state_round_trip():
    guard = _warm_guard(loss_z=5.0)
    guard.check(math.nan, 1.0)
    other = OutlierGuard(window=8, loss_z=5.0)
    other.load_state_dict(guard.state_dict())
    assert other.check(3.02, 1.0) == guard.check(3.02, 1.0)


@pytest.fixture
def poisoned_steps(monkeypatch):
    """Make the loss of chosen training steps (counted in calls of next_batch) NaN."""
    import data.loader

    original = data.loader.DistributedDataLoader.next_batch
    calls = {"n": 0}
    poisoned: set[int] = set()

    def next_batch(self):
        x, y = original(self)
        calls["n"] += 1
        if calls["n"] in poisoned:
            y = torch.full_like(y, -1)  # every target ignored: mean over nothing -> NaN loss
        return x, y

    monkeypatch.setattr(data.loader.DistributedDataLoader, "next_batch", next_batch)
    return poisoned


def test_nan_step_is_skipped_and_never_reaches_the_weights(tmp_path, poisoned_steps):
    config = tiny_config(tmp_path, max_steps=4, total_batch_size=64, checkpoint_every=1, keep_last=10)  # grad_accum 1
    poisoned_steps.add(3)  # the third optimizer step (index 2)
    train(config)
    records = read_metrics(config.out_dir)
    assert [r["skipped"] for r in records] == [False, False, True, False]
    assert records[2]["loss"] is None  # NaN is written as null
    from gpt2.checkpoint import load_checkpoint
    from gpt2.run_dir import RunDir

    after_2 = load_checkpoint(RunDir(config.out_dir).checkpoint(2))["model"]
    after_3 = load_checkpoint(RunDir(config.out_dir).checkpoint(3))["model"]
    for name in after_2:
        assert torch.equal(after_2[name], after_3[name]), name
    assert all(torch.isfinite(t).all() for t in final_params(config.out_dir).values())


def test_training_aborts_with_a_clear_error(tmp_path, poisoned_steps):
    config = tiny_config(tmp_path, max_steps=6, max_bad_steps=2)
    poisoned_steps.update({2, 3})
    with pytest.raises(TrainingDivergedError, match="2 steps in a row"):
        train(config)
