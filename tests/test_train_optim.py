"""AdamW parameter groups and learning-rate schedules against hand computations."""

import math

import pytest
import torch

from gpt2.model import GPT
from gpt2.optim import configure_optimizer, lr_at
from gpt2.config import parse_model_spec
from tests.fixtures.train.tiny import TINY_MODEL

LR, STEPS, WARMUP = 6e-4, 1000, 100


def test_warmup_is_linear_from_lr_over_warmup():
    assert lr_at(0, LR, STEPS, WARMUP) == pytest.approx(LR / 100)
    assert lr_at(49, LR, STEPS, WARMUP) == pytest.approx(LR * 0.5)
    assert lr_at(99, LR, STEPS, WARMUP) == pytest.approx(LR)


@pytest.mark.parametrize("final_frac", [0.0, 0.1])
def test_cosine(final_frac):
    min_lr = LR * final_frac
    assert lr_at(100, LR, STEPS, WARMUP, "cosine", final_frac) == pytest.approx(LR)
    assert lr_at(550, LR, STEPS, WARMUP, "cosine", final_frac) == pytest.approx((LR + min_lr) / 2)  # halfway
    # a quarter of the way: cos(pi/4) = sqrt(2)/2
    expected = min_lr + 0.5 * (1 + math.sqrt(2) / 2) * (LR - min_lr)
    assert lr_at(325, LR, STEPS, WARMUP, "cosine", final_frac) == pytest.approx(expected)
    assert lr_at(STEPS, LR, STEPS, WARMUP, "cosine", final_frac) == pytest.approx(min_lr, abs=1e-15)


def test_linear_and_unknown():
    assert lr_at(550, LR, STEPS, WARMUP, "linear", 0.1) == pytest.approx(LR - 0.5 * 0.9 * LR)
    with pytest.raises(ValueError, match="unknown lr schedule"):
        lr_at(500, LR, STEPS, WARMUP, "step")


def test_constant_warms_up_unlike_llmc():
    # llm.c's `constant` ignores warmup (max_lr from step 0); ours warms up first, then stays at max_lr
    assert lr_at(0, LR, STEPS, WARMUP, "constant") == pytest.approx(LR / WARMUP)
    assert lr_at(WARMUP, LR, STEPS, WARMUP, "constant") == LR
    assert lr_at(STEPS - 1, LR, STEPS, WARMUP, "constant", final_lr_frac=0.1) == LR  # no decay
    assert lr_at(0, LR, STEPS, 0, "constant") == LR  # warmup 0: llm.c's constant


@pytest.mark.parametrize("final_frac", [0.0, 0.1])
def test_wsd_is_llmc_one_minus_sqrt_decay(final_frac):
    # llm.c: stable until decay_point = (int)(0.8f * steps) = 800, then min + (1 - sqrt(r)) * (max - min)
    # with r = (step - 800) / (1000 - 800)
    min_lr = LR * final_frac
    assert lr_at(WARMUP - 1, LR, STEPS, WARMUP, "wsd", final_frac, 0.2) == pytest.approx(LR)  # warmup as usual
    assert lr_at(799, LR, STEPS, WARMUP, "wsd", final_frac, 0.2) == LR
    assert lr_at(800, LR, STEPS, WARMUP, "wsd", final_frac, 0.2) == pytest.approx(LR)  # r = 0
    for step, r in ((820, 0.1), (850, 0.25), (900, 0.5), (980, 0.9), (999, 0.995)):
        expected = min_lr + (1 - math.sqrt(r)) * (LR - min_lr)
        assert lr_at(step, LR, STEPS, WARMUP, "wsd", final_frac, 0.2) == pytest.approx(expected, rel=1e-12), step
    assert lr_at(850, LR, STEPS, WARMUP, "wsd", final_frac, 0.2) == pytest.approx(min_lr + 0.5 * (LR - min_lr))
    assert lr_at(STEPS, LR, STEPS, WARMUP, "wsd", final_frac, 0.2) == pytest.approx(min_lr, abs=1e-15)


def test_wsd_decay_point_is_llmcs_float32_truncation():
    # 7 steps: (int)(0.8f * 7) = (int)5.6 = 5, so steps 5 and 6 decay: r = 0 and 1/2
    assert lr_at(4, LR, 7, 0, "wsd", 0.0, 0.2) == LR
    assert lr_at(5, LR, 7, 0, "wsd", 0.0, 0.2) == LR
    assert lr_at(6, LR, 7, 0, "wsd", 0.0, 0.2) == pytest.approx(LR * (1 - math.sqrt(0.5)))
    # decay_frac generalises llm.c's fixed 20 %: the point is (int)(float32(1 - decay_frac) * steps), and
    # float32(0.9) * 10 rounds to 9.0 in float32 (as C computes it), not to 8.99999976
    assert lr_at(8, LR, 10, 0, "wsd", 0.0, 0.1) == LR
    assert lr_at(9, LR, 10, 0, "wsd", 0.0, 0.1) == LR  # r = 0


def test_wsd_decay_point_inside_warmup_follows_llmc():
    # warmup 90 of 100 steps, decay point 80: llm.c warms up through step 89, then decays from r = 10/20
    assert lr_at(89, LR, 100, 90, "wsd", 0.0, 0.2) == pytest.approx(LR)
    assert lr_at(90, LR, 100, 90, "wsd", 0.0, 0.2) == pytest.approx(LR * (1 - math.sqrt(0.5)))


def test_weight_decay_only_on_matrices():
    model = GPT.create(parse_model_spec(TINY_MODEL))
    opt = configure_optimizer(model, lr=1e-3, weight_decay=0.1)
    names = {id(p): n for n, p in model.named_parameters()}
    decayed = {names[id(p)] for p in opt.param_groups[0]["params"]}
    plain = {names[id(p)] for p in opt.param_groups[1]["params"]}
    assert (opt.param_groups[0]["weight_decay"], opt.param_groups[1]["weight_decay"]) == (0.1, 0.0)
    layer_matrices = ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")
    matrices = {"transformer.wte.weight", "transformer.wpe.weight"} | {
        f"transformer.h.{i}.{m}.weight" for i in range(2) for m in layer_matrices
    }
    assert decayed == matrices
    assert all(n.endswith(".bias") or ".ln_" in n for n in plain)
    # every parameter exactly once; the tied lm_head is wte, not a second tensor
    assert len(decayed) + len(plain) == len(list(model.parameters()))
    assert opt.param_groups[0]["betas"] == (0.9, 0.95) and opt.param_groups[0]["eps"] == 1e-8


def test_adamw_step_matches_hand_update():
    """One AdamW step on a 2-D and a 1-D tensor: decoupled decay only on the 2-D one."""
    model = torch.nn.Linear(3, 2)
    w0, b0 = model.weight.detach().clone(), model.bias.detach().clone()
    opt = configure_optimizer(model, lr=0.1, weight_decay=0.5)
    model.weight.grad = torch.full_like(w0, 2.0)
    model.bias.grad = torch.full_like(b0, -3.0)
    opt.step()
    # step 1: m_hat = g, v_hat = g^2 -> update = sign(g) (eps negligible)
    torch.testing.assert_close(model.weight.detach(), w0 * (1 - 0.1 * 0.5) - 0.1)
    torch.testing.assert_close(model.bias.detach(), b0 + 0.1)
