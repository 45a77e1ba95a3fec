"""GPT-2 as one readable torch.nn.Module.

Parameter names follow GPT-2 (`transformer.h.0.attn.c_attn.weight`, ...) so checkpoints map one to one
onto llm.c model files (gpt2/llmc.py) and Hugging Face checkpoints (gpt2/hf.py). Linear weights are in
nn.Linear's (out, in) layout. The vocabulary is padded from 50257 to 50304 rows for faster matmuls; the
padding rows are zero, never looked up, and sliced off every logit a caller or the loss sees.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn as nn
import torch.nn.functional as F

from gpt2.config import GPTConfig
from gpt2.init import init_weights
from gpt2_kernels import add_layernorm, biased_linear, causal_attention, fused_mlp, linear_cross_entropy, projection
from gpt2_kernels.attention import packed_attention_enabled
from gpt2_kernels.compile import register_inductor_fallbacks
from gpt2_kernels.mlp import gelu_epilogue_enabled, layers_keeping_post


# A branch's two weight matrices already in the compute dtype (`GPT.forward`'s cast_weights), or None for one to
# be cast where it is used
BranchCasts = tuple[torch.Tensor | None, torch.Tensor | None]


def sdpa_attention(qkv: torch.Tensor, n_head: int) -> torch.Tensor:
    """Causal self-attention through SDPA on the c_attn output: (B, T, 3C) -> (B, T, C)."""
    B, T, C3 = qkv.size()
    C = C3 // 3
    q, k, v = qkv.split(C, dim=2)  # 3 x (B, T, C)
    q = q.view(B, T, n_head, C // n_head).transpose(1, 2)  # (B, nh, T, hs)
    k = k.view(B, T, n_head, C // n_head).transpose(1, 2)  # (B, nh, T, hs)
    v = v.view(B, T, n_head, C // n_head).transpose(1, 2)  # (B, nh, T, hs)
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, nh, T, hs)
    return y.transpose(1, 2).contiguous().view(B, T, C)  # (B, T, C): heads side by side


@contextmanager
def _without_default_init() -> Iterator[None]:
    """Modules built inside skip their own init (nn.Linear's kaiming_uniform_, nn.Embedding's normal_, ...):
    `GPT.empty`'s weights are all overwritten. (Built on the meta device instead, the init calls and
    `to_empty` would run through torch._dynamo and sympy, whose first imports take ~2 CPU-seconds of every
    process that only loads a checkpoint: evaluate, sample, export, the pipeline's init stage.)"""
    originals = {name: getattr(nn.init, name) for name in dir(nn.init)
                 if name.endswith("_") and not name.startswith("_")}
    for name in originals:
        setattr(nn.init, name, lambda tensor, *args, **kwargs: tensor)
    try:
        yield
    finally:
        for name, function in originals.items():
            setattr(nn.init, name, function)


def swapped(linear: nn.Linear) -> bool:
    """True when a converter has replaced this nn.Linear by a subclass with its own matmul (bench/fp8.py:
    torchao's float8 training); the fused path then calls it as a module so the swap reaches it."""
    return type(linear) is not nn.Linear


def project(layer: nn.Linear, x: torch.Tensor, cast_weight: torch.Tensor | None = None,
            weight_grad: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """layer(x) for the fused path, as (output, the bias whose gradient add_layernorm sums): a plain nn.Linear
    adds its bias in the GEMM, as a constant, and leaves its gradient to the add_layernorm after it, which
    sums d(residual) anyway (gpt2_kernels.linear.projection: its weight gradient in fp32; cast_weight, its weight
    already in x's dtype, or None to cast it there; weight_grad, a buffer the weight's gradient is added into, or
    None); a swapped one runs whole, bias and its gradient included (GPT.projections() is empty then)."""
    if swapped(layer):
        return layer(x), None
    return projection(x, layer.weight, layer.bias, cast_weight, weight_grad), layer.bias


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.n_head = config.n_head
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd)  # q, k, v for all heads at once
        self.c_proj = nn.Linear(config.n_embd, config.n_embd)  # projection back into the residual stream

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(sdpa_attention(self.c_attn(x), self.n_head))

    def fused_branch(self, x: torch.Tensor, packed_attention: bool, cast_weights: BranchCasts = (None, None),
                     proj_weight_grad: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The fused path's branch as `project` returns it: with packed_attention, gpt2_kernels.causal_attention
        (cuDNN forward, FA4 backward into one packed gradient); else SDPA. x carries a column of ones
        (gpt2_kernels/linear.py), from which c_attn's bias gradient comes. cast_weights: c_attn's and c_proj's
        weights in x's dtype (`GPT.forward`), or None for each to be cast where it is used; proj_weight_grad: the
        buffer c_proj's weight gradient is added into (`GPT.forward`'s weight_grads), or None."""
        c_attn_weight, c_proj_weight = cast_weights
        qkv = (self.c_attn(x) if swapped(self.c_attn) else
               biased_linear(x, self.c_attn.weight, self.c_attn.bias, c_attn_weight))
        y = causal_attention(qkv, self.n_head) if packed_attention else sdpa_attention(qkv, self.n_head)
        return project(self.c_proj, y, c_proj_weight, proj_weight_grad)  # (B, T, C)


class MLP(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd)
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd)  # back into the residual stream

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(self._hidden(x))

    def fused_branch(self, x: torch.Tensor, gelu_epilogue_dtype: torch.dtype | None, keep_post: bool = False,
                     cast_weights: BranchCasts = (None, None), proj_weight_grad: torch.Tensor | None = None
                     ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The fused path's branch as `project` returns it: with a dtype, gpt2_kernels.fused_mlp (the GELU
        inside quack's matmuls) computing in it, keeping the GELU's output for backward with keep_post;
        else the plain ops, compiled. Swapped linears (FP8) keep their own matmuls, so quack's are not
        used then. cast_weights: c_fc's and c_proj's weights in the compute dtype (`GPT.forward`), or None;
        proj_weight_grad: the buffer c_proj's weight gradient is added into (`GPT.forward`), or None."""
        if gelu_epilogue_dtype is not None and not swapped(self.c_fc):
            return fused_mlp(x, self.c_fc.weight, self.c_fc.bias, self.c_proj.weight, self.c_proj.bias,
                             gelu_epilogue_dtype, keep_post, cast_weights, proj_weight_grad), self.c_proj.bias
        return project(self.c_proj, self._hidden(x), cast_weights[1], proj_weight_grad)

    def _hidden(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(self.c_fc(x), approximate="tanh")  # (B, T, 4C): GPT-2's tanh GELU


class Block(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, config: GPTConfig, use_kernels: bool = False):
        """Builds the module tree; weights are set by `gpt2.init.init_weights` (or `GPT.create`).

        `use_kernels` selects the fused Triton path of gpt2_kernels/ (CUDA); the plain path above is the
        reference and the CPU path.
        """
        super().__init__()
        self.config = config
        self.use_kernels = use_kernels
        if use_kernels:
            register_inductor_fallbacks()  # else torch 2.11's compile of this path stalls (gpt2_kernels/compile.py)
        self.transformer = nn.ModuleDict(
            dict(
                wte=nn.Embedding(config.padded_vocab_size, config.n_embd),
                wpe=nn.Embedding(config.block_size, config.n_embd),
                h=nn.ModuleList(Block(config) for _ in range(config.n_layer)),
                ln_f=nn.LayerNorm(config.n_embd),
            )
        )
        self.lm_head = nn.Linear(config.n_embd, config.padded_vocab_size, bias=False)
        self.lm_head.weight = self.transformer.wte.weight  # tied: one tensor, trained once

    @classmethod
    def empty(cls, config: GPTConfig, device: torch.device | str = "cpu", use_kernels: bool = False) -> "GPT":
        """A model with uninitialised weights, for `init_weights` or a checkpoint reader to fill.

        Built without the modules' own init, so no time or global RNG state goes into nn.Linear's
        default init that would be overwritten anyway.
        """
        with torch.device(device), _without_default_init():
            return cls(config, use_kernels=use_kernels)

    @classmethod
    def create(
        cls, config: GPTConfig, seed: int = 42, device: torch.device | str = "cpu", use_kernels: bool = False
    ) -> "GPT":
        """A model initialised in llm.c's PyTorch RNG order (gpt2/init.py), then moved to `device`."""
        model = cls.empty(config, device="cpu", use_kernels=use_kernels)  # init draws on a CPU generator
        init_weights(model, seed=seed)
        return model.to(device)

    @classmethod
    def from_descriptor(cls, descriptor: str, seed: int = 42, **kwargs) -> "GPT":
        """`GPT.from_descriptor("d12")`: llm.c's model descriptors, initialised from `seed`."""
        return cls.create(GPTConfig.from_descriptor(descriptor), seed=seed, **kwargs)

    def matrices(self) -> list[nn.Parameter]:
        """The weight matrices the fused path casts to the compute dtype in every forward: each block's c_attn,
        attn.c_proj, c_fc and mlp.c_proj, in that order (`forward`'s cast_weights); none where that path does
        not run, or runs swapped linears (bench/fp8.py), which cast their own."""
        return [layer.weight for layer in self._fused_linears()]

    def projections(self) -> list[nn.Parameter]:
        """The weights whose gradient the fused path adds into a caller's buffer in their weight-gradient GEMM
        (`forward`'s weight_grads): each block's attn.c_proj and mlp.c_proj, whose dW is a dense product; c_attn's
        and c_fc's come with their bias's as [dW | db] (gpt2_kernels/linear.py). None where `matrices` has none."""
        return [layer.weight for layer in self._fused_linears()[1::2]]

    def _fused_linears(self) -> list[nn.Linear]:
        """`matrices`' layers: each block's c_attn, attn.c_proj, c_fc, mlp.c_proj, or none."""
        layers = [m for block in self.transformer.h for m in (block.attn.c_attn, block.attn.c_proj, block.mlp.c_fc,
                                                                block.mlp.c_proj)]
        return [] if not self.use_kernels or any(map(swapped, layers)) else layers

    def num_parameters(self) -> int:
        """Parameter count as llm.c reports it: the tied lm_head once, wte with its padding rows."""
        return sum(p.numel() for p in self.parameters())  # parameters() yields a shared tensor once

    def forward(
        self, idx: torch.Tensor, targets: torch.Tensor | None = None, return_logits: bool = True,
        cast_weights: list[torch.Tensor] | None = None, weight_grads: list[torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """idx (B, T) token ids -> (logits (B, T, vocab_size) or None, mean cross-entropy or None).

        Targets equal to -1 are ignored by the loss. `return_logits=False` lets the training step
        skip keeping the full logits alive when it only needs the loss. `cast_weights`: `matrices()` already
        in the compute dtype (gpt2.step.CastWeights, once per optimizer step), read by the fused path instead
        of casting them again; None: it casts them. `weight_grads`: buffers for `projections()`' gradients
        (gpt2.step.FlatGradients' views), which the backward adds those gradients into, giving autograd none for
        them; None: autograd gets them.
        """
        # data-dependent checks (a host sync) stay out of compiled and CUDA graphs
        if not (torch.compiler.is_compiling() or (idx.is_cuda and torch.cuda.is_current_stream_capturing())):
            self._check_input(idx, targets)
        B, T = idx.size()
        V = self.config.vocab_size
        pos = torch.arange(T, dtype=torch.long, device=idx.device)  # (T,)
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)  # (B, T, C)
        if self.use_kernels:
            n_layer = len(self.transformer.h)
            x = self._fused_blocks(x, cast_weights or [None] * (4 * n_layer), weight_grads or [None] * (2 * n_layer))
        else:
            for block in self.transformer.h:
                x = block(x)
            x = self.transformer.ln_f(x)
        if self.use_kernels and targets is not None and not return_logits:
            # fused classifier: loss and its gradients over row chunks, no (B, T, V) logits held
            return None, linear_cross_entropy(x, self.lm_head.weight, targets, V, ignore_index=-1)
        logits = self.lm_head(x)[..., :V]  # (B, T, V): padded vocab columns never seen
        loss = None
        if targets is not None:
            # under bf16 autocast cross_entropy runs in float32 (it is on autocast's float32 list)
            loss = F.cross_entropy(logits.reshape(B * T, V), targets.reshape(B * T), ignore_index=-1)
        return (logits if return_logits else None), loss

    def _fused_blocks(self, x: torch.Tensor, cast_weights: list[torch.Tensor | None],
                      weight_grads: list[torch.Tensor | None]) -> torch.Tensor:
        """The blocks and ln_f through gpt2_kernels/: each residual add is fused with the LayerNorm after it.

        Same function as the plain loop, with llm.c's rounding: the residual stream is kept in the
        activation dtype (bf16 under autocast; custom ops do not see autocast, so it is passed
        explicitly); each branch's c_proj adds its bias in its GEMM, rounding once as the plain path and llm.c
        do, and the add_layernorm after it gives the bias's gradient (`project`). The LayerNorms before c_attn
        and c_fc write their output with a column of ones beside it, from which those layers' bias gradients
        come (gpt2_kernels/linear.py).
        x (B, T, C) is the embedding sum, cast_weights and weight_grads `forward`'s (None each where unused);
        returns ln_f's output.
        """
        device = x.device.type
        act_dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else x.dtype
        blocks = self.transformer.h
        # each LayerNorm after the first: ln_2 of every block, then the next block's ln_1, then ln_f
        next_ln = [blocks[i + 1].ln_1 for i in range(len(blocks) - 1)] + [self.transformer.ln_f]
        first = blocks[0].ln_1
        packed_attention = packed_attention_enabled(x.device)
        gelu_epilogue_dtype = act_dtype if gelu_epilogue_enabled(x.device) else None
        B, T, C = x.size()
        # the first MLPs keep the GELU's output for backward, as far as the configured memory budget goes
        keeping_post = layers_keeping_post(len(blocks), B * T, 4 * C, act_dtype)
        residual, h = add_layernorm(x.to(act_dtype), None, first.weight, first.bias, first.eps, act_dtype,
                                    ones_column=True)
        for i, (block, ln) in enumerate(zip(blocks, next_ln)):
            attn_casts, mlp_casts = cast_weights[4 * i:4 * i + 2], cast_weights[4 * i + 2:4 * i + 4]
            y, proj_bias = block.attn.fused_branch(h, packed_attention, attn_casts, weight_grads[2 * i])
            residual, h = add_layernorm(residual, y, block.ln_2.weight, block.ln_2.bias, block.ln_2.eps,
                                        act_dtype, bias_in_y=proj_bias, ones_column=True)
            y, proj_bias = block.mlp.fused_branch(h, gelu_epilogue_dtype, keep_post=i < keeping_post,
                                                  cast_weights=mlp_casts, proj_weight_grad=weight_grads[2 * i + 1])
            residual, h = add_layernorm(residual, y, ln.weight, ln.bias, ln.eps, act_dtype, bias_in_y=proj_bias,
                                        ones_column=ln is not self.transformer.ln_f)  # ln_f: the classifier's
        return h

    def _check_input(self, idx: torch.Tensor, targets: torch.Tensor | None) -> None:
        if idx.dim() != 2:
            raise ValueError(f"idx must have shape (B, T), got {tuple(idx.shape)}")
        T = idx.size(1)
        if T > self.config.block_size:
            raise ValueError(
                f"sequence length {T} exceeds the model's max_seq_len {self.config.block_size}; "
                f"use T <= {self.config.block_size}"
            )
        for name, ids, lowest in (("token id", idx, 0), ("target", targets, -1)):
            if ids is None or ids.numel() == 0:
                continue
            lo, hi = int(ids.min()), int(ids.max())
            if lo < lowest or hi >= self.config.vocab_size:
                raise ValueError(
                    f"{name}s must lie in [{lowest}, {self.config.vocab_size}), got range [{lo}, {hi}]; "
                    "the padded vocabulary rows are not real tokens"
                )
        if targets is not None and targets.shape != idx.shape:
            raise ValueError(f"targets shape {tuple(targets.shape)} differs from idx shape {tuple(idx.shape)}")
