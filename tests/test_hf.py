"""Hugging Face interop and numerical parity with transformers' GPT2LMHeadModel (the reference)."""

import pytest
import torch

from gpt2.config import GPTConfig
from gpt2.hf import export_hf, import_hf
from gpt2.model import GPT

transformers = pytest.importorskip("transformers")


def _hf_reference(config: GPTConfig, our: GPT) -> "transformers.GPT2LMHeadModel":
    """transformers' own GPT-2 built from a config (no download), loaded with our weights by hand."""
    hf_config = transformers.GPT2Config(
        vocab_size=config.vocab_size, n_positions=config.block_size, n_embd=config.n_embd,
        n_layer=config.n_layer, n_head=config.n_head, activation_function="gelu_new",
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, layer_norm_epsilon=1e-5,
    )  # fmt: skip
    hf = transformers.GPT2LMHeadModel(hf_config).eval()
    ours = our.state_dict()
    with torch.no_grad():
        for name, param in hf.named_parameters():
            src = ours[name]
            if name == "transformer.wte.weight":
                src = src[: config.vocab_size]
            elif name.endswith(("c_attn.weight", "c_proj.weight", "c_fc.weight")):
                src = src.t()  # HF Conv1D is (in, out)
            param.copy_(src)
    return hf


def _random_model(config: GPTConfig, seed: int) -> GPT:
    model = GPT.create(config, seed=seed)
    with torch.no_grad():  # non-trivial LayerNorms and biases
        for name, p in model.named_parameters():
            if name.endswith(("bias", "ln_1.weight", "ln_2.weight", "ln_f.weight")):
                p.add_(0.1 * torch.randn_like(p))
    return model


CONFIGS = {
    "tiny": GPTConfig(n_layer=2, n_head=4, n_embd=32, block_size=64, vocab_size=50257),
    "d12": GPTConfig.from_descriptor("d12"),
}


@pytest.mark.parametrize("name", ["tiny", "d12"])
def test_logits_loss_and_gradients_match_transformers(name):
    config = CONFIGS[name]
    ours = _random_model(config, seed=0)
    hf = _hf_reference(config, ours)
    idx = torch.randint(0, config.vocab_size, (2, 48), generator=torch.Generator().manual_seed(0))
    targets = torch.roll(idx, -1, dims=1)
    logits, loss = ours(idx, targets)
    out = hf(input_ids=idx, labels=idx)  # HF shifts labels inside; ours takes shifted targets
    ref_loss = torch.nn.functional.cross_entropy(out.logits[:, :-1].reshape(-1, config.vocab_size), idx[:, 1:].reshape(-1))
    _, our_loss_shifted = ours(idx[:, :-1], idx[:, 1:])

    scale = out.logits.abs().max().item()
    assert (logits - out.logits).abs().max().item() <= 1e-4 * max(scale, 1.0)
    assert abs(our_loss_shifted.item() - out.loss.item()) <= 1e-5
    assert abs(our_loss_shifted.item() - ref_loss.item()) <= 1e-5

    # every parameter's gradient, same loss on both sides
    torch.nn.functional.cross_entropy(out.logits.reshape(-1, config.vocab_size), targets.reshape(-1)).backward()
    loss.backward()
    ours_by_name = dict(ours.named_parameters())
    for pname, hp in hf.named_parameters():
        g = ours_by_name[pname].grad
        if pname == "transformer.wte.weight":
            assert torch.count_nonzero(g[config.vocab_size :]) == 0  # padding rows never get gradient
            g = g[: config.vocab_size]
        elif pname.endswith(("c_attn.weight", "c_proj.weight", "c_fc.weight")):
            g = g.t()
        rel = (g - hp.grad).norm() / hp.grad.norm().clamp_min(1e-12)
        assert rel.item() <= 1e-4, pname


def test_export_loads_in_transformers_and_matches(tmp_path):
    config = CONFIGS["tiny"]
    ours = _random_model(config, seed=1)
    export_hf(ours, tmp_path / "hf")
    hf = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "hf").eval()
    idx = torch.randint(0, config.vocab_size, (1, 20))
    with torch.no_grad():
        torch.testing.assert_close(hf(input_ids=idx).logits, ours(idx)[0], rtol=1e-4, atol=1e-4)
    assert hf.lm_head.weight.data_ptr() == hf.transformer.wte.weight.data_ptr()


def test_import_of_a_transformers_saved_checkpoint(tmp_path):
    # a directory written by transformers itself, as a user's download would be
    config = CONFIGS["tiny"]
    hf = _hf_reference(config, _random_model(config, seed=2))
    hf.save_pretrained(tmp_path / "saved")
    ours = import_hf(tmp_path / "saved")
    assert ours.config == config
    idx = torch.randint(0, config.vocab_size, (2, 16))
    with torch.no_grad():
        torch.testing.assert_close(ours(idx)[0], hf(input_ids=idx).logits, rtol=1e-4, atol=1e-4)
    assert torch.count_nonzero(ours.transformer.wte.weight[config.vocab_size :]) == 0


def test_import_accepts_openai_style_keys_without_prefix(tmp_path):
    # the original OpenAI checkpoint names keys `h.0.attn.c_attn.weight` and stores the causal mask buffer
    from safetensors.torch import load_file, save_file

    config = CONFIGS["tiny"]
    ours = _random_model(config, seed=3)
    export_hf(ours, tmp_path / "hf")
    state = load_file(str(tmp_path / "hf" / "model.safetensors"))
    state = {k.removeprefix("transformer."): v for k, v in state.items()}
    state["h.0.attn.bias"] = torch.ones(1, 1, 64, 64)
    save_file(state, str(tmp_path / "hf" / "model.safetensors"))
    back = import_hf(tmp_path / "hf")
    for (name, a), b in zip(ours.state_dict().items(), back.state_dict().values()):
        assert torch.equal(a, b), name


def test_import_errors_name_the_directory(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json: missing"):
        import_hf(tmp_path)
    # e.g. a training run directory: it has a config.json, but not a GPT-2 one
    (tmp_path / "config.json").write_text('{"model": "d12", "batch_size": 64}')
    with pytest.raises(ValueError, match="config.json: not a Hugging Face GPT-2 config, it lacks n_layer, n_head"):
        import_hf(tmp_path)
