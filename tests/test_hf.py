"""Hugging Face interop and numerical parity with transformers' GPT2LMHeadModel (the reference)."""

import re
import shutil
import subprocess
import sys

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


@pytest.mark.parametrize("text, message", [(b'{"n_layer": 2,', r"config\.json: not valid JSON \(Expecting"),
                                           (b'{"n_layer": "\xff"}', r"config\.json: not UTF-8 text: byte 0xff at byte "
                                                                      r"offset 13 of the file")])
def test_import_of_a_config_that_is_not_json_names_the_file(tmp_path, text, message):
    """Before: `JSONDecodeError: Expecting value: line 1 column 15 (char 14)` or `UnicodeDecodeError: 'utf-8'
    codec can't decode byte 0xff in position 13`, naming no file."""
    (tmp_path / "config.json").write_bytes(text)
    with pytest.raises(ValueError, match=rf"^{re.escape(str(tmp_path))}/{message}"):
        import_hf(tmp_path)


# ----------------------------------------------------------------------------------------------------
# a complete exported directory: weights, config and the tokenizer, loaded by transformers offline

# varied text: accents, CJK, emoji (4-byte UTF-8, ZWJ sequences), combining marks, RTL, whitespace runs
# (tabs, newlines, trailing spaces), contractions, numbers, code, and text that looks like special tokens
TEXTS = [
    "Hello, I'm a language model,",
    "  leading and trailing spaces   ",
    "tabs\tand\n\nnewlines\r\n  \n\t mixed   runs     of whitespace\u3000(ideographic space)",
    "Ünïcödé: naïve café, Straße, ﬁ ligature, e\u0301 combining, 日本語のテキスト, 한국어, עברית, العربية",
    "emoji 👩‍👩‍👧‍👦 🇫🇷 🤖🤖🤖 and math ∑∫√∞ ≠ ≤",
    "they'll've we're it's I'd 'S 'LL don't",
    "numbers 3.14159 1,000,000 0x1F 2026-11-23 12345678901234567890",
    "def f(x):\n    return {'a': [1, 2, 3]}  # code\n",
    "<|endofprompt|> <|fim_prefix|> < | endoftext | >",
    "",
]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    config = CONFIGS["tiny"]
    model = _random_model(config, seed=4)
    out = export_hf(model, tmp_path_factory.mktemp("export") / "hf")
    return model, out


@pytest.fixture(scope="module")
def enc():
    from data.tokenizer import get_gpt2_encoding

    return get_gpt2_encoding()


def test_exported_model_logits_equal_ours(exported):
    model, out = exported
    hf = transformers.GPT2LMHeadModel.from_pretrained(out, local_files_only=True).eval()
    idx = torch.randint(0, model.config.vocab_size, (3, 40), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        ours, theirs = model(idx)[0], hf(input_ids=idx).logits
    assert theirs.dtype == torch.float32
    torch.testing.assert_close(theirs, ours, rtol=1e-5, atol=1e-5)


def test_exported_tokenizer_ids_equal_tiktoken_encode_ordinary(exported, enc):
    _, out = exported
    tok = transformers.AutoTokenizer.from_pretrained(out, local_files_only=True)
    assert tok.is_fast and tok.vocab_size == 50257 and tok.eos_token_id == tok.bos_token_id == 50256
    assert tok.model_max_length == CONFIGS["tiny"].block_size
    for text in TEXTS:
        ids = tok(text)["input_ids"]
        assert ids == enc.encode_ordinary(text), text  # no BOS/EOS added, no prefix space
        assert tok.decode(ids) == text  # no clean-up of spaces


def test_vocab_and_merges_files_alone_give_the_same_tokenizer(exported, enc, tmp_path):
    # vocab.json + merges.txt are what other tools (and transformers without tokenizer.json) read
    _, out = exported
    for name in ("vocab.json", "merges.txt"):
        shutil.copy(out / name, tmp_path / name)
    tok = transformers.GPT2TokenizerFast.from_pretrained(tmp_path, local_files_only=True)
    for text in TEXTS:
        assert tok(text)["input_ids"] == enc.encode_ordinary(text), text


def test_endoftext_is_the_special_token_unless_split(exported, enc):
    # transformers treats the literal "<|endoftext|>" as token 50256 (tiktoken's allowed_special="all");
    # split_special_tokens=True gives encode_ordinary's ids, which is how the shards encode documents
    _, out = exported
    tok = transformers.AutoTokenizer.from_pretrained(out, local_files_only=True)
    text = "end of one document.<|endoftext|>Start of the next<|endoftext|>"
    assert tok(text)["input_ids"] == enc.encode(text, allowed_special="all")
    assert tok(text)["input_ids"].count(50256) == 2
    assert tok(text, split_special_tokens=True)["input_ids"] == enc.encode_ordinary(text)
    assert 50256 not in enc.encode_ordinary(text)


def test_export_is_complete_offline_and_refuses_to_clobber(exported, tmp_path):
    model, out = exported
    names = {p.name for p in out.iterdir()}
    assert names == {"model.safetensors", "config.json", "vocab.json", "merges.txt", "tokenizer.json",
                     "tokenizer_config.json", "special_tokens_map.json"}
    assert not list(out.parent.glob(".tmp_*"))  # nothing left of the temporary directory
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match="mine exists and is not empty.*--force"):
        export_hf(model, tmp_path / "mine")
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"
    export_hf(model, tmp_path / "mine", overwrite=True)
    (tmp_path / "file").write_text("not a directory")
    with pytest.raises(FileExistsError, match="file is a file"):
        export_hf(model, tmp_path / "file", overwrite=True)
    assert not (tmp_path / "mine" / "notes.txt").exists()
    assert (tmp_path / "mine" / "model.safetensors").read_bytes() == (out / "model.safetensors").read_bytes()


def test_exported_files_share_the_mode_of_a_file_the_user_writes(exported, tmp_path):
    _, out = exported
    (tmp_path / "plain").write_text("")  # what open() gives under this umask
    expected = (tmp_path / "plain").stat().st_mode & 0o777
    modes = {p.name: oct(p.stat().st_mode & 0o777) for p in out.iterdir()}
    assert set(modes.values()) == {oct(expected)}, modes


def test_a_model_without_gpt2s_vocabulary_gets_no_tokenizer(tmp_path):
    model = _random_model(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=32, vocab_size=256), seed=6)
    out = export_hf(model, tmp_path / "hf")
    assert {p.name for p in out.iterdir()} == {"model.safetensors", "config.json"}


# ----------------------------------------------------------------------------------------------------
# the command line: python -m gpt2.export_hf


def test_cli_help():
    result = subprocess.run([sys.executable, "-m", "gpt2.export_hf", "--help"], capture_output=True, text=True)
    assert result.returncode == 0
    assert "--checkpoint" in result.stdout and "--out" in result.stdout and "--force" in result.stdout


def test_cli_exports_the_latest_checkpoint_of_a_run(tmp_path, capsys, enc):
    from gpt2.checkpoint import write_initial_checkpoint
    from gpt2.weights import load_model
    from gpt2.export_hf import main

    write_initial_checkpoint(tmp_path / "run", "n_layer=2,n_head=2,n_embd=32,block_size=64", seed=3)
    out = main(["--checkpoint", str(tmp_path / "run"), "--out", str(tmp_path / "hf")])
    assert f"(step 0) to {tmp_path / 'hf'}" in capsys.readouterr().out
    ours, _ = load_model(tmp_path / "run")
    hf = transformers.GPT2LMHeadModel.from_pretrained(out, local_files_only=True).eval()
    idx = torch.randint(0, 50257, (2, 64), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        torch.testing.assert_close(hf(input_ids=idx).logits, ours(idx)[0], rtol=1e-5, atol=1e-5)
    tok = transformers.AutoTokenizer.from_pretrained(out, local_files_only=True)
    assert tok("Hello world")["input_ids"] == enc.encode_ordinary("Hello world")

    # an existing export is replaced only with --force; a source that is no model is named
    with pytest.raises(SystemExit) as exit_info:
        main(["--checkpoint", str(tmp_path / "run"), "--out", str(tmp_path / "hf")])
    assert exit_info.value.code == 1
    assert "hf exists and is not empty" in capsys.readouterr().err
    main(["--checkpoint", str(tmp_path / "run"), "--out", str(tmp_path / "hf"), "--force"])
    with pytest.raises(SystemExit):
        main(["--checkpoint", str(tmp_path / "nothing"), "--out", str(tmp_path / "hf2")])
    assert "nothing: not a checkpoint directory" in capsys.readouterr().err
    assert not (tmp_path / "hf2").exists()
