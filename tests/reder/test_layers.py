import pytest
import torch

from reder.layers import ActNorm, AttentionBranch, FeedForwardBranch
from reder.reversible import invert_ops, run_trunk
from tests.reder.helpers import padding_mask, tiny_model

LENGTHS = [7, 4, 1]


@pytest.mark.parametrize("layers_per_end", [1, 2, 4])
@pytest.mark.parametrize("direction,back", [("src2tgt", "tgt2src"), ("tgt2src", "src2tgt")])
@pytest.mark.parametrize("dtype,tolerance", [(torch.float64, 1e-10), (torch.float32, 1e-4)])
def test_layers_round_trip(layers_per_end, direction, back, dtype, tolerance):
    model = tiny_model(layers_per_end=layers_per_end, dropout=0.0, attention_dropout=0.0).to(dtype).eval()
    h = torch.randn(3, 7, 16, dtype=dtype)
    mask = padding_mask(LENGTHS)
    out = model.layers(h, mask, direction)
    assert out.shape == h.shape and (out - h).abs().max() > 1e-3  # it does something
    assert (model.layers(out, mask, back) - h).abs().max() < tolerance


@pytest.mark.parametrize("direction", ["src2tgt", "tgt2src"])
def test_round_trip_with_dropout_when_masks_are_reused(direction):
    model = tiny_model(layers_per_end=3, dropout=0.3, attention_dropout=0.2).double().train()
    h = torch.randn(3, 7, 16, dtype=torch.float64)
    mask = padding_mask(LENGTHS)
    ops = model.ops(direction)
    (out,), rngs = run_trunk(h, mask, ops, memory_efficient=False)
    (again,), _ = run_trunk(h, mask, ops, memory_efficient=False)
    assert (again - out).abs().max() > 1e-3  # fresh masks differ: dropout is live
    (back,), _ = run_trunk(out, mask, invert_ops(ops), memory_efficient=False, rngs=rngs[::-1])
    assert (back - h).abs().max() < 1e-10


def test_operation_order_is_a_palindrome_and_directions_mirror():
    model = tiny_model(layers_per_end=3).eval()
    calls: list[tuple[str, int]] = []
    for module in model.modules():
        if isinstance(module, (AttentionBranch, FeedForwardBranch)):
            kind = "s" if isinstance(module, AttentionBranch) else "f"
            module.register_forward_hook(lambda m, i, o, kind=kind: calls.append((kind, id(m))))
    h, mask = torch.randn(2, 5, 16), padding_mask([5, 3])
    model.layers(h, mask, "src2tgt")
    forward_calls, calls[:] = list(calls), []
    model.layers(h, mask, "tgt2src")
    kinds = "".join(kind for kind, _ in forward_calls)
    assert kinds == "sf" * 3 + "fs" * 3 and kinds == kinds[::-1]
    assert calls == forward_calls[::-1]  # tgt2src visits the same sub-layers in exactly the reverse order
    src_ids = {id(m) for m in model.ends["src"].modules()}
    assert all(module in src_ids for _, module in forward_calls[:6])


def test_actnorm_is_data_initialised_and_invertible():
    norm = ActNorm(6).double()
    x = torch.randn(4, 5, 6, dtype=torch.float64) * 3 + 2
    mask = padding_mask([5, 2, 4, 1])
    x[~mask] = 1e6  # padding must not leak into the statistics
    norm.initialize(x, mask)
    y = norm(x)[mask]
    assert torch.allclose(y.mean(0), torch.zeros(6, dtype=torch.float64), atol=1e-8)
    assert torch.allclose(y.std(0, unbiased=False), torch.ones(6, dtype=torch.float64), atol=1e-5)
    assert (norm.inverse(norm(x)) - x).abs().max() < 1e-6
    assert bool(norm.initialized)
