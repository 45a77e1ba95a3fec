"""Model descriptors against llm.c's tables (train_gpt2.cu), written out here independently of gpt2/config.py."""

import pytest

from gpt2.config import GPTConfig
from gpt2.model import GPT

# llm.c's gpt2_set_hyperparameters: depth -> (channels, heads), max_seq_len 1024; the size its comment names
GPT2_TABLE = {
    "d6": (6, 384, 6, 30e6),
    "d12": (12, 768, 12, 124e6),
    "d24": (24, 1024, 16, 350e6),
    "d36": (36, 1280, 20, 774e6),
    "d48": (48, 1600, 25, 1558e6),
    "d60": (60, 1920, 30, 2.7e9),
    "d72": (72, 2880, 30, 7.3e9),
    "d84": (84, 3456, 36, 12.2e9),
}
# llm.c's gpt3_set_hyperparameters: channels -> (depth, head size), heads = channels / head size, max_seq_len 2048
GPT3_TABLE = {
    "gpt3:c384": (6, 384, 64, 31e6),
    "gpt3:c768": (12, 768, 64, 125e6),
    "gpt3:c1024": (24, 1024, 64, 350e6),
    "gpt3:c1536": (24, 1536, 96, 760e6),
    "gpt3:c2048": (24, 2048, 128, 1.3e9),
    "gpt3:c2560": (32, 2560, 80, 2.7e9),
    "gpt3:c4096": (32, 4096, 128, 6.7e9),
    "gpt3:c12288": (96, 12288, 128, 175e9),
}


@pytest.mark.parametrize("descriptor", GPT2_TABLE)
def test_gpt2_descriptors_are_llmc_table(descriptor):
    layers, channels, heads, _ = GPT2_TABLE[descriptor]
    config = GPTConfig.from_descriptor(descriptor)
    assert (config.n_layer, config.n_embd, config.n_head, config.block_size) == (layers, channels, heads, 1024)
    assert (config.vocab_size, config.padded_vocab_size) == (50257, 50304)
    # llm.c also spells them gpt2:dN
    assert GPTConfig.from_descriptor(f"gpt2:{descriptor}") == config


@pytest.mark.parametrize("descriptor", GPT3_TABLE)
def test_gpt3_descriptors_are_llmc_table(descriptor):
    layers, channels, head_size, _ = GPT3_TABLE[descriptor]
    config = GPTConfig.from_descriptor(descriptor)
    assert (config.n_layer, config.n_embd, config.n_head, config.block_size) == (
        layers, channels, channels // head_size, 2048,
    )
    assert config.head_size == head_size
    assert (config.vocab_size, config.padded_vocab_size) == (50257, 50304)


def test_gpt3_heads_where_llmc_fixed_them():
    # head size 80 (32 heads), not 64; and 128-wide heads for the two largest
    assert GPTConfig.from_descriptor("gpt3:c2560").n_head == 32
    assert GPTConfig.from_descriptor("gpt3:c4096").n_head == 32
    assert GPTConfig.from_descriptor("gpt3:c12288").n_head == 96


# d12's exact count, 124,475,904, is checked by hand in tests/test_model.py
@pytest.mark.parametrize("descriptor", [*GPT2_TABLE, *GPT3_TABLE])
def test_parameter_counts_match_the_sizes_llmc_names(descriptor):
    # llm.c's comments name each model by a rounded size (e.g. "gpt2-large (774M)"): 350M is the conventional
    # name of the 355M mediums, and d60's 2,754M is called 2.7B, so 3 % covers every rounding
    named = {**GPT2_TABLE, **GPT3_TABLE}[descriptor][3]
    count = GPT.empty(GPTConfig.from_descriptor(descriptor), device="meta").num_parameters()
    assert abs(count - named) / named < 0.03, count


@pytest.mark.parametrize("bad", ["d13", "gpt3:c777", "gpt3:c5140", "gpt2:c768", "gpt2", "d", ""])
def test_unknown_descriptor_is_a_clear_error(bad):
    with pytest.raises(ValueError, match=r"unknown model descriptor.*known: d6, d12.*d84.*gpt3:c384"):
        GPTConfig.from_descriptor(bad)
