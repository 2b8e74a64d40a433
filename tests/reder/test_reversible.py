import pytest
import torch

from reder import DuplexLoss, LossConfig
from reder.reversible import run_trunk
from tests.reder.helpers import padding_mask, random_batch, tiny_model


def _trunk_grads(model, h, mask, direction, memory_efficient, keep_all):
    model.zero_grad()
    h = h.clone().requires_grad_()
    torch.manual_seed(1)
    states, _ = run_trunk(h, mask, model.ops(direction), memory_efficient, keep_all=keep_all)
    weights = torch.linspace(-1, 1, h.shape[-1], dtype=h.dtype)
    loss = sum((state.pow(2) * weights).sum() / (i + 1) for i, state in enumerate(states))
    loss.backward()
    return [h.grad.clone()] + [p.grad.clone() for p in model.parameters() if p.grad is not None]


@pytest.mark.parametrize("keep_all", [False, True])
@pytest.mark.parametrize("direction", ["src2tgt", "tgt2src"])
@pytest.mark.parametrize("share_ends", [False, True])
def test_memory_efficient_gradients_equal_plain_autograd(keep_all, direction, share_ends):
    model = tiny_model(layers_per_end=3, dropout=0.2, attention_dropout=0.1, share_ends=share_ends).double().train()
    h, mask = torch.randn(3, 6, 16, dtype=torch.float64), padding_mask([6, 4, 2])
    plain = _trunk_grads(model, h, mask, direction, memory_efficient=False, keep_all=keep_all)
    efficient = _trunk_grads(model, h, mask, direction, memory_efficient=True, keep_all=keep_all)
    assert len(plain) == len(efficient) == 1 + sum(1 for p in model.parameters() if p.grad is not None)
    for a, b in zip(plain, efficient):
        assert (a - b).abs().max() < 1e-8


def test_full_loss_gradients_equal_plain_autograd_with_aux_terms():
    loss_config = LossConfig(lambda_fba=0.5, lambda_cc=0.5)
    plain = tiny_model(memory_efficient=False).double().train()
    efficient = tiny_model(memory_efficient=True).double().train()
    efficient.load_state_dict(plain.state_dict())
    src, src_lengths = random_batch([5, 3, 4], 12)
    tgt, tgt_lengths = random_batch([4, 4, 2], 12)
    results = []
    for model in (plain, efficient):
        torch.manual_seed(3)
        terms = DuplexLoss(model, loss_config)(src, src_lengths, tgt, tgt_lengths, step=0)
        terms["total"].backward()
        results.append((terms, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}))
    (terms_a, grads_a), (terms_b, grads_b) = results
    for name in terms_a:
        assert torch.allclose(terms_a[name], terms_b[name], atol=1e-12), name
    assert terms_a["fba_src2tgt"] > 0 and terms_a["cc_tgt2src"] > 0
    assert grads_a.keys() == grads_b.keys() and len(grads_a) == len(list(plain.parameters()))
    for name in grads_a:
        assert (grads_a[name] - grads_b[name]).abs().max() < 1e-8, name


def test_memory_efficient_trunk_keeps_no_activations():
    """Plain autograd saves per-layer activations; the reversible function saves only its output state."""
    model = tiny_model(layers_per_end=4, dropout=0.1).train()
    h, mask = torch.randn(2, 6, 16, requires_grad=True), padding_mask([6, 5])
    counts = {}
    for memory_efficient in (False, True):
        saved = {}
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.setdefault(t.data_ptr(), t.numel()) and t, lambda t: t):
            run_trunk(h, mask, model.ops("src2tgt"), memory_efficient)
        counts[memory_efficient] = sum(saved.values())  # distinct saved buffers
    assert counts[True] <= 2 * 6 * 16 + 2 * 6  # the last state and the mask
    assert counts[False] > 20 * counts[True]
