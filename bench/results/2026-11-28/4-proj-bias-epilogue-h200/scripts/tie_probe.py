"""CPU probe: how far a 1e-6 step of the c_proj biases moves the loss in fp32, plain bf16 and the fused path,
for one model size; prints one JSON line. Run from the tree whose code is probed (old or new)."""
import json
import sys
import time

import torch

from gpt2.config import GPTConfig
from gpt2.model import GPT

n_layer, n_head, n_embd, T, B, vocab, seed = map(int, sys.argv[1:8])
t0 = time.time()
config = GPTConfig(n_layer=n_layer, n_head=n_head, n_embd=n_embd, block_size=T, vocab_size=vocab)
idx = torch.randint(0, config.vocab_size, (B, T + 1), generator=torch.Generator().manual_seed(seed))
reference = GPT.create(config, seed=42)
reference(idx[:, :-1], idx[:, 1:], return_logits=False)[1].backward()
step = {name: -1e-6 * p.grad.sign() for name, p in reference.named_parameters() if name.endswith("c_proj.bias")}


def loss_change(use_kernels, bf16):
    model = GPT.create(config, seed=42, use_kernels=use_kernels)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        before = model(idx[:, :-1], idx[:, 1:], return_logits=False)[1].item()
        for name, p in model.named_parameters():
            p.add_(step.get(name, 0.0))
        return model(idx[:, :-1], idx[:, 1:], return_logits=False)[1].item() - before


fp32, plain, fused = loss_change(False, False), loss_change(False, True), loss_change(True, True)
ok = abs(fused - fp32) <= 2 * abs(plain - fp32) + 1e-4
print(json.dumps(dict(cfg=sys.argv[1:8], fp32=fp32, plain=plain, fused=fused, passes=ok,
                      s=round(time.time() - t0, 1))), flush=True)
