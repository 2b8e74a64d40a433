import math

import torch

from reder import LossConfig
from reder.losses import forward_backward_agreement
from reder.reversible import run_trunk
from tests.reder.helpers import padding_mask, random_batch, tiny_model

TERMS = {f"{kind}_{d}" for kind in ("ctc", "fba", "cc") for d in ("src2tgt", "tgt2src")} | {"total"}


def test_fba_is_zero_when_states_agree_and_matches_the_textbook_formula():
    mask = padding_mask([3, 2])
    states = [torch.randn(2, 3, 4, requires_grad=True) for _ in range(3)]
    assert forward_backward_agreement(states, [s.detach().clone() for s in states], mask).abs() < 1e-6
    others = [torch.randn(2, 3, 4) for _ in range(3)]
    value = forward_backward_agreement(states, others, mask)
    expected, count = 0.0, 0
    for forward, reverse in zip(states, others):
        for b in range(2):
            for t in range(3):
                if mask[b, t]:
                    u, v = forward[b, t].tolist(), reverse[b, t].tolist()
                    dot = sum(x * y for x, y in zip(u, v))
                    norms = math.sqrt(sum(x * x for x in u)) * math.sqrt(sum(y * y for y in v))
                    expected, count = expected + 1 - dot / norms, count + 1
    assert abs(value.item() - expected / count) < 1e-5
    value.backward()
    assert all(s.grad is not None and s.grad.abs().sum() > 0 for s in states)


def test_reverse_states_line_up_with_forward_states():
    """Started from the forward pass's last state, the reverse pass (same masks) reproduces every forward
    state in the lined-up order, so FBA is zero there."""
    model = tiny_model(layers_per_end=3, dropout=0.2).double().train()
    h0, mask = torch.randn(2, 5, 16, dtype=torch.float64), padding_mask([5, 3])
    ops = model.ops("src2tgt")
    states, rngs = run_trunk(h0, mask, ops, memory_efficient=False, keep_all=True)
    forward = [h0, *states]
    reverse = model.reverse_states(states[-1], mask, ops, rngs)
    assert len(reverse) == len(forward) == 2 * 3 + 1
    for a, b in zip(forward, reverse):
        assert (a - b).abs().max() < 1e-10
    assert forward_backward_agreement(forward, reverse, mask).abs() < 1e-12


def test_aux_terms_are_off_before_aux_start_step_and_on_after():
    model = tiny_model(LossConfig(lambda_fba=0.3, lambda_cc=0.2, aux_start_step=10)).train()
    src, src_lengths = random_batch([5, 4], 12)
    tgt, tgt_lengths = random_batch([4, 3], 12)
    before = model.loss(src, src_lengths, tgt, tgt_lengths, step=9)
    after = model.loss(src, src_lengths, tgt, tgt_lengths, step=10)
    assert set(before) == set(after) == TERMS
    for name in TERMS - {"total"}:
        assert (before[name] == 0) == name.startswith(("fba", "cc")), name
        assert after[name] > 0, name
    ctc = sum(after[f"ctc_{d}"] for d in ("src2tgt", "tgt2src"))
    fba = sum(after[f"fba_{d}"] for d in ("src2tgt", "tgt2src"))
    cc = sum(after[f"cc_{d}"] for d in ("src2tgt", "tgt2src"))
    assert torch.allclose(after["total"], ctc + 0.3 * fba + 0.2 * cc)
    assert torch.allclose(before["total"], before["ctc_src2tgt"] + before["ctc_tgt2src"])


def test_cycle_consistency_gives_gradient_through_the_reverse_pass():
    model = tiny_model(LossConfig(lambda_fba=0.0, lambda_cc=1.0)).train()
    src, src_lengths = random_batch([5, 4], 12)
    tgt, tgt_lengths = random_batch([4, 3], 12)
    terms = model.loss(src, src_lengths, tgt, tgt_lengths, step=0)
    assert terms["fba_src2tgt"] == 0
    terms["cc_src2tgt"].backward()  # x → ȳ (hard, no gradient) → x̂: only the tgt2src pass carries gradient
    grads = {name: p.grad for name, p in model.named_parameters()}
    assert grads["positions.tgt.weight"].abs().sum() > 0  # ȳ is read by the tgt end
    assert grads["positions.src.weight"] is None or grads["positions.src.weight"].abs().sum() == 0
    for end in ("src", "tgt"):
        layer_grads = [p.grad for n, p in model.named_parameters() if n.startswith(f"ends.{end}.")]
        assert all(g is not None and g.abs().sum() > 0 for g in layer_grads)


def test_fba_gives_gradient_to_the_forward_pass():
    model = tiny_model(LossConfig(lambda_fba=1.0, lambda_cc=0.0)).train()
    src, src_lengths = random_batch([5, 4], 12)
    tgt, tgt_lengths = random_batch([4, 3], 12)
    terms = model.loss(src, src_lengths, tgt, tgt_lengths, step=0)
    terms["fba_src2tgt"].backward()
    grads = {name: p.grad for name, p in model.named_parameters()}
    assert grads["positions.src.weight"].abs().sum() > 0  # the forward pass reads src
    assert all(p.grad.abs().sum() > 0 for n, p in model.named_parameters() if n.startswith("ends."))


def test_one_direction_at_a_time_gives_the_joint_gradient():
    model = tiny_model(LossConfig(lambda_fba=0.5, lambda_cc=0.5), dropout=0.0, attention_dropout=0.0).double().train()
    src, src_lengths = random_batch([5, 4], 12)
    tgt, tgt_lengths = random_batch([4, 3], 12)
    joint = model.loss(src, src_lengths, tgt, tgt_lengths, step=0)
    joint["total"].backward()
    expected = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    for direction in ("src2tgt", "tgt2src"):
        terms = model.loss(src, src_lengths, tgt, tgt_lengths, step=0, directions=(direction,))
        assert set(terms) == {f"ctc_{direction}", f"fba_{direction}", f"cc_{direction}", "total"}
        assert torch.allclose(terms[f"ctc_{direction}"], joint[f"ctc_{direction}"])
        terms["total"].backward()
    for name, param in model.named_parameters():
        assert torch.allclose(param.grad, expected[name], atol=1e-10), name
