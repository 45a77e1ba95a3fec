"""c_attn's and c_fc's weight gradients come out of their GEMM as they lie, rows C + 8 apart (no dense copy), at
odd shapes: the values against autograd through F.linear, the layout, the fake kernels' layout against the real
ones' (opcheck), and FlatGradients adding such gradients into its dense buffer the same as a dense add. And
torch.compile's cache keys carrying a digest of the kernels' sources, without which a graph compiled for the other
layout was served from the cache."""

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import gpt2_kernels.mlp as mlp_op
from gpt2.step import FlatGradients
from gpt2_kernels import with_ones_column
from gpt2_kernels.linear import ONES_COLUMNS, _biased_linear_bwd, empty_weight_grad, weight_and_bias_grads
from tests.fixtures.numerics import rel_err

OPCHECKS = ("test_schema", "test_faketensor")  # the AOT ones clone h, which drops the ones column


@pytest.mark.parametrize("N, C, out", [(7, 5, 15), (1, 3, 9), (33, 12, 36)])
def test_weight_gradient_is_the_gemms_product_in_place(N, C, out):
    g = torch.Generator().manual_seed(N)
    h, dy = torch.randn(N, C, dtype=torch.float64, generator=g), torch.randn(N, out, dtype=torch.float64, generator=g)
    dw, db = weight_and_bias_grads(dy, with_ones_column(h), torch.float64)
    assert dw.shape == (out, C) and dw.stride() == (C + ONES_COLUMNS, 1)
    assert db.is_contiguous() and db.untyped_storage().data_ptr() != dw.untyped_storage().data_ptr()
    assert rel_err(dw, dy.t() @ h) < 1e-12 and rel_err(db, dy.sum(0)) < 1e-12
    assert empty_weight_grad(torch.empty(out, C), torch.float64).stride() == dw.stride()


@pytest.mark.parametrize("C, out", [(5, 15), (12, 7)])
def test_fake_kernels_lay_out_the_weight_gradient_as_the_real_ones(C, out):
    g = torch.Generator().manual_seed(C)
    h = with_ones_column(torch.randn(9, C, generator=g))
    dy, w = torch.randn(9, out, generator=g), torch.randn(out, C, generator=g)
    torch.library.opcheck(_biased_linear_bwd, (dy, h, w, torch.float32), test_utils=OPCHECKS)
    w_fc, w_proj = torch.randn(4 * C, C, generator=g), torch.randn(C, 4 * C, generator=g)
    pre = torch.randn(9, 4 * C, generator=g)
    dw_fc = mlp_op._mlp_bwd(torch.randn(9, C, generator=g), h, pre, pre.new_empty(0), w_fc, w_proj, torch.float32,
                            None)[1]
    assert dw_fc.stride() == (C + ONES_COLUMNS, 1)
    torch.library.opcheck(mlp_op._mlp_bwd, (torch.randn(9, C, generator=g), h, pre, pre.new_empty(0), w_fc, w_proj,
                                            torch.float32, None), test_utils=OPCHECKS)


def test_flat_gradients_add_gradients_of_either_layout():
    g = torch.Generator().manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(*shape, generator=g)) for shape in ((6, 5), (6,), (3, 7), (11,))]
    flat = FlatGradients(params)
    flat.attach_zeroed()
    expected = [torch.zeros_like(p) for p in params]
    for _ in range(3):
        # the first, like c_attn's dW, a view of a wider product; the rest dense
        grads = [torch.randn(6, 5 + ONES_COLUMNS, generator=g)[:, :5]] + [torch.randn(p.shape, generator=g)
                                                                        for p in params[1:]]
        flat.accumulate(grads)
        expected = [e + gr for e, gr in zip(expected, grads)]
    for p, e in zip(params, expected):
        assert torch.equal(p.grad, e)


def test_biased_linear_weight_gradient_matches_f_linear_at_odd_shape():
    from gpt2_kernels import biased_linear

    g = torch.Generator().manual_seed(1)
    h, w, b = (torch.randn(*s, dtype=torch.float64, generator=g) for s in ((13, 7), (11, 7), (11,)))
    dy = torch.randn(13, 11, dtype=torch.float64, generator=g)
    wl, bl = w.clone().requires_grad_(), b.clone().requires_grad_()
    dw, db = torch.autograd.grad(biased_linear(with_ones_column(h), wl, bl), (wl, bl), dy)
    ref = [t.clone().requires_grad_() for t in (h, w, b)]
    dw_ref, db_ref = torch.autograd.grad(F.linear(*ref), ref[1:], dy)
    assert rel_err(dw, dw_ref) < 1e-12 and rel_err(db, db_ref) < 1e-12


def test_compile_caches_are_keyed_on_the_kernels_sources(tmp_path):
    """Importing kernels puts a digest of its sources into torch.compile's cache-key tag, so a graph compiled
    with the fake kernels of another version (another weight-gradient layout, say) is not served to this one;
    a tag the user set stays in front, and tagging twice adds nothing."""
    import gpt2_kernels.compile as kc

    digest = kc.source_digest(Path(kc.__file__).parent)
    assert f"gpt2_kernels:{digest}" in torch.compiler.config.cache_key_tag  # by the import
    # the config's own patch: pytest's monkeypatch, undoing, deletes the setting (hides it from torch.compile,
    # which then fails in every later test of the process)
    with torch.compiler.config.patch(cache_key_tag="users-tag"):
        kc.tag_compile_caches()
        kc.tag_compile_caches()
        assert torch.compiler.config.cache_key_tag == f"users-tag|gpt2_kernels:{digest}"
    assert f"gpt2_kernels:{digest}" in torch.compiler.config.cache_key_tag
    for name, text in (("a", "x = 1\n"), ("b", "x = 2\n")):  # one byte apart
        (tmp_path / name).mkdir()
        (tmp_path / name / "linear.py").write_text(text)
    assert kc.source_digest(tmp_path / "a") != kc.source_digest(tmp_path / "b")
