"""Gradient accumulation equals the big batch; with bf16 activations gradients still add in float32."""

import json
from pathlib import Path

import torch

from gpt2.distributed import DistContext
from gpt2.model import GPT
from gpt2.train import forward_backward, train
from gpt2.config import parse_model_spec
from tests.fixtures.train.tiny import single_thread  # noqa: F401 (autouse fixture)
from tests.fixtures.train.tiny import TINY_MODEL, final_params, read_metrics, tiny_config


def test_grad_accum_2x_b2_equals_grad_accum_1x_b4(tmp_path):
    # file order: llm.c's order permutes samples of B x T tokens, so other B would mean other data
    big = tiny_config(tmp_path / "big", batch_size=4, seq_len=16, total_batch_size=64, max_steps=5, train_order="file")
    accum = tiny_config(tmp_path / "accum", batch_size=2, seq_len=16, total_batch_size=64, max_steps=5,
                        train_order="file")
    train(big)
    train(accum)
    resolved = json.loads((Path(accum.out_dir) / "config.json").read_text())["resolved"]
    assert resolved["grad_accum_steps"] == 2

    big_losses = [r["loss"] for r in read_metrics(big.out_dir)]
    accum_losses = [r["loss"] for r in read_metrics(accum.out_dir)]
    assert len(big_losses) == 5
    torch.testing.assert_close(torch.tensor(accum_losses), torch.tensor(big_losses), rtol=1e-6, atol=1e-6)
    big_params, accum_params = final_params(big.out_dir), final_params(accum.out_dir)
    initial = GPT.create(parse_model_spec(TINY_MODEL), seed=big.seed).state_dict()
    qkv = "transformer.h.0.attn.c_attn.weight"
    assert not torch.equal(big_params[qkv], initial[qkv])  # the runs trained
    # AdamW divides by sqrt(v), so where a gradient is near zero the last bits of a different summation order
    # (two micro-batches added in fp32 against one batch) move a parameter by up to a few 1e-6 over these
    # 5 steps at lr 1e-3 (1.4e-6, one element of 3072, on one CPU model); the second micro-batch at half
    # weight still fails this check at the first tensor, with the loss check above switched off
    for name, value in big_params.items():
        torch.testing.assert_close(accum_params[name], value, rtol=1e-5, atol=1e-5, msg=name)


class _FixedBatches:
    """A loader stand-in handing out the given micro-batches in order."""

    def __init__(self, batches):
        self.batches = list(batches)

    def next_batch(self):
        return self.batches.pop(0)


def test_bf16_autocast_gradients_accumulate_in_float32(tmp_path):
    torch.manual_seed(0)
    model = GPT.create(parse_model_spec(TINY_MODEL))
    micro_batches = [(torch.randint(0, 256, (2, 16)), torch.randint(0, 256, (2, 16))) for _ in range(2)]
    config = tiny_config(tmp_path, dtype="bfloat16", grad_clip=0.0)
    ctx = DistContext(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"))

    # reference: each micro-batch's gradient on its own (bf16 autocast, loss / 2), summed in float32
    per_micro = []
    for x, y in micro_batches:
        model.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            _, loss = model(x, y, return_logits=False)
        (loss / 2).backward()
        per_micro.append({n: p.grad.clone() for n, p in model.named_parameters()})
    model.zero_grad(set_to_none=True)

    forward_backward(model, _FixedBatches(micro_batches), grad_accum=2, config=config, ctx=ctx)
    rounded_differently = 0
    for name, p in model.named_parameters():
        g1, g2 = per_micro[0][name], per_micro[1][name]
        assert p.grad.dtype == torch.float32
        torch.testing.assert_close(p.grad, g1 + g2, rtol=0, atol=0, msg=name)  # add in float32, exactly
        rounded_differently += not torch.equal(p.grad, (g1.bfloat16() + g2.bfloat16()).float())
    assert rounded_differently > 0  # the test can tell float32 accumulation from bf16 accumulation
