import math

import pytest
import torch

from reder import DuplexLoss, LossConfig, TransformerConfig
from reder.autoregressive import Transformer
from reder.configio import ConfigError, FieldError
from reder.ctc import pad_batch, valid_mask
from reder.objectives.directional import CmlmObjective, TeacherObjective, cmlm_loss, teacher_loss
from reder.objectives.duplex import glance, reverse_states
from reder.objectives.terms import forward_backward_agreement, glance_mask, uniform_mask
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
    reverse = reverse_states(states[-1], mask, ops, rngs)
    assert len(reverse) == len(forward) == 2 * 3 + 1
    for a, b in zip(forward, reverse):
        assert (a - b).abs().max() < 1e-10
    assert forward_backward_agreement(forward, reverse, mask).abs() < 1e-12


def test_aux_terms_are_absent_before_aux_start_step_and_on_after():
    """A term not computed is absent, not a zero (a trainer's window means then average it over the
    updates that computed it)."""
    model = tiny_model().train()
    objective = DuplexLoss(model, LossConfig(lambda_fba=0.3, lambda_cc=0.2, aux_start_step=10))
    src, src_lengths = random_batch([5, 4], 12)
    tgt, tgt_lengths = random_batch([4, 3], 12)
    before = objective(src, src_lengths, tgt, tgt_lengths, step=9)
    after = objective(src, src_lengths, tgt, tgt_lengths, step=10)
    assert set(before) == {"ctc_src2tgt", "ctc_tgt2src", "total"} and set(after) == TERMS
    for name in TERMS - {"total"}:
        assert after[name] > 0, name
    ctc = sum(after[f"ctc_{d}"] for d in ("src2tgt", "tgt2src"))
    fba = sum(after[f"fba_{d}"] for d in ("src2tgt", "tgt2src"))
    cc = sum(after[f"cc_{d}"] for d in ("src2tgt", "tgt2src"))
    assert torch.allclose(after["total"], ctc + 0.3 * fba + 0.2 * cc)
    assert torch.allclose(before["total"], before["ctc_src2tgt"] + before["ctc_tgt2src"])


def test_cycle_consistency_gives_gradient_through_the_reverse_pass():
    model = tiny_model().train()
    src, src_lengths = random_batch([5, 4], 12)
    tgt, tgt_lengths = random_batch([4, 3], 12)
    terms = DuplexLoss(model, LossConfig(lambda_fba=0.0, lambda_cc=1.0))(src, src_lengths, tgt, tgt_lengths, step=0)
    assert "fba_src2tgt" not in terms  # weight 0: not computed
    terms["cc_src2tgt"].backward()  # x → ȳ (hard, no gradient) → x̂: only the tgt2src pass carries gradient
    grads = {name: p.grad for name, p in model.named_parameters()}
    assert grads["positions.tgt.weight"].abs().sum() > 0  # ȳ is read by the tgt end
    assert grads["positions.src.weight"] is None or grads["positions.src.weight"].abs().sum() == 0
    for end in ("src", "tgt"):
        layer_grads = [p.grad for n, p in model.named_parameters() if n.startswith(f"ends.{end}.")]
        assert all(g is not None and g.abs().sum() > 0 for g in layer_grads)


def test_fba_gives_gradient_to_the_forward_pass():
    model = tiny_model().train()
    src, src_lengths = random_batch([5, 4], 12)
    tgt, tgt_lengths = random_batch([4, 3], 12)
    terms = DuplexLoss(model, LossConfig(lambda_fba=1.0, lambda_cc=0.0))(src, src_lengths, tgt, tgt_lengths, step=0)
    terms["fba_src2tgt"].backward()
    grads = {name: p.grad for name, p in model.named_parameters()}
    assert grads["positions.src.weight"].abs().sum() > 0  # the forward pass reads src
    assert all(p.grad.abs().sum() > 0 for n, p in model.named_parameters() if n.startswith("ends."))


def test_one_direction_at_a_time_gives_the_joint_gradient():
    model = tiny_model(dropout=0.0, attention_dropout=0.0).double().train()
    objective = DuplexLoss(model, LossConfig(lambda_fba=0.5, lambda_cc=0.5))
    src, src_lengths = random_batch([5, 4], 12)
    tgt, tgt_lengths = random_batch([4, 3], 12)
    joint = objective(src, src_lengths, tgt, tgt_lengths, step=0)
    joint["total"].backward()
    expected = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    for direction in ("src2tgt", "tgt2src"):
        terms = objective(src, src_lengths, tgt, tgt_lengths, step=0, directions=(direction,))
        assert set(terms) == {f"ctc_{direction}", f"fba_{direction}", f"cc_{direction}", "total"}
        assert torch.allclose(terms[f"ctc_{direction}"], joint[f"ctc_{direction}"])
        terms["total"].backward()
    for name, param in model.named_parameters():
        assert torch.allclose(param.grad, expected[name], atol=1e-10), name


def test_fba_and_cc_have_their_own_start_steps_and_default_to_aux_start_step():
    """The rule: fba_start_step / cc_start_step override aux_start_step for their loss; unset they are it, so a
    config written before them (aux_start_step alone) means what it meant."""
    old = LossConfig.from_dict({"lambda_fba": 0.3, "lambda_cc": 0.2, "aux_start_step": 10})  # an old saved section
    assert (old.start_step("fba"), old.start_step("cc")) == (10, 10)
    assert old == LossConfig(0.3, 0.2, 10) and LossConfig().start_step("fba") == LossConfig().start_step("cc") == 0
    split = LossConfig(lambda_fba=0.3, lambda_cc=0.2, aux_start_step=10, fba_start_step=5, cc_start_step=20)
    assert (split.start_step("fba"), split.start_step("cc")) == (5, 20)
    assert LossConfig(aux_start_step=10, cc_start_step=0).start_step("fba") == 10
    objective = DuplexLoss(tiny_model().train(), split)
    src, src_lengths = random_batch([5, 4], 12)
    tgt, tgt_lengths = random_batch([4, 3], 12)
    for step, fba_on, cc_on in ((4, False, False), (5, True, False), (19, True, False), (20, True, True)):
        terms = objective(src, src_lengths, tgt, tgt_lengths, step=step)
        for d in ("src2tgt", "tgt2src"):
            assert (f"fba_{d}" in terms) == fba_on and (f"cc_{d}" in terms) == cc_on, (step, d)
            assert all(terms[name] > 0 for name in (f"fba_{d}", f"cc_{d}") if name in terms)


def test_start_steps_and_directions_are_checked():
    with pytest.raises(ValueError, match=r"^fba_start_step: must be an int >= 0 or null \(= aux_start_step\), got -1$"):
        LossConfig(fba_start_step=-1)
    with pytest.raises(FieldError, match=r"^directions: must be one or both of \['src2tgt', 'tgt2src'\], each once, "
                                         r"got \['en2de'\]$"):
        LossConfig(directions=("en2de",))
    for bad in ((), ("src2tgt", "src2tgt")):
        with pytest.raises(FieldError, match="^directions: "):
            LossConfig(directions=bad)
    with pytest.raises(ConfigError, match=r"^directions: must be one or both"):
        LossConfig.from_dict({"directions": ["src2tgt", "x"]})
    assert LossConfig.from_dict({"directions": ["tgt2src"]}).directions == ("tgt2src",)


@pytest.mark.parametrize("direction", ["src2tgt", "tgt2src"])
def test_a_simplex_model_trains_its_one_direction_only(direction):
    """loss.directions = (d,): the other direction's terms are absent and the positions only its reading end
    uses get no gradient; the total is d's main term (a clean simplex: no FBA/CC)."""
    other = "tgt2src" if direction == "src2tgt" else "src2tgt"
    model = tiny_model().train()
    simplex = DuplexLoss(model, LossConfig(0.0, 0.0, directions=(direction,)))
    assert simplex.directions == (direction,)
    src, src_lengths = random_batch([5, 4], 12)
    tgt, tgt_lengths = random_batch([4, 3], 12)
    terms = simplex(src, src_lengths, tgt, tgt_lengths, 0)
    assert set(terms) == {f"ctc_{direction}", "total"}  # FBA and CC at weight 0: not computed
    assert torch.equal(terms["total"], terms[f"ctc_{direction}"])
    terms["total"].backward()
    unread = "positions.tgt.weight" if direction == "src2tgt" else "positions.src.weight"
    grads = dict(model.named_parameters())
    assert grads[unread].grad is None
    assert all(p.grad is not None for n, p in model.named_parameters() if n != unread)
    # a KD micro-batch (tgt2src on its own pairs) trains the one direction too
    model.zero_grad()
    kd = simplex(src, src_lengths, tgt, tgt_lengths, 0, tgt2src_batch=(tgt, tgt_lengths, src, src_lengths))
    assert not any(name.endswith(other) for name in kd)
    # the duplex model gives the same network both directions' terms and a gradient everywhere
    duplex = tiny_model().train()
    both = DuplexLoss(duplex, LossConfig(0.0, 0.0))(src, src_lengths, tgt, tgt_lengths, 0)
    assert {f"ctc_{direction}", f"ctc_{other}"} <= set(both)
    both["total"].backward()
    assert all(p.grad is not None for p in duplex.parameters())


def test_glance_mask_draws_the_number_random_count_among_the_candidates():
    """n = ⌊ratio · (wrong candidates) + 0.5⌋ positions per sentence, only candidates, each candidate drawn."""
    torch.manual_seed(0)
    layout = torch.randint(4, 9, (3, 12))
    predicted = layout.clone()
    predicted[0, :7] += 1  # 7 wrong; sentence 1 all right; sentence 2: 3 wrong, of which 1 not a candidate
    predicted[2, [2, 5, 11]] += 1
    candidates = torch.ones(3, 12, dtype=torch.bool)
    candidates[2, 11] = candidates[1, 0] = False
    seen = torch.zeros(3, 12, dtype=torch.long)
    for seed in range(200):
        for ratio, counts in ((0.0, [0, 0, 0]), (0.5, [4, 0, 1]), (1.0, [7, 0, 2])):
            chosen = glance_mask(layout, candidates, predicted, ratio, torch.Generator().manual_seed(seed))
            assert chosen.sum(dim=1).tolist() == counts and not bool((chosen & ~candidates).any())
            if ratio == 1.0:
                seen += chosen
    assert bool((seen[0] > 0).all()) and bool((seen[2][candidates[2]] > 0).all())  # any candidate can be drawn


def test_uniform_mask_draws_counts_and_positions_uniformly() -> None:
    lengths = torch.tensor([4, 1, 0, 6]).repeat(2000)
    masked = uniform_mask(lengths, 6)
    assert not (masked & ~valid_mask(lengths, 6)).any()  # real positions only
    counts = masked.sum(dim=1).view(2000, 4)
    assert counts[:, 1].eq(1).all() and counts[:, 2].eq(0).all()
    for column, length in ((0, 4), (3, 6)):
        histogram = torch.bincount(counts[:, column], minlength=length + 1).float()
        assert histogram[0] == 0
        expected = 2000 / length  # n uniform in 1..length
        assert ((histogram[1:] - expected).abs() < 5 * math.sqrt(expected)).all(), histogram
        per_position = masked.view(2000, 4, 6)[:, column, :length].sum(dim=0).float()
        expected_position = counts[:, column].sum().item() / length  # every position equally likely
        assert ((per_position - expected_position).abs() < 5 * math.sqrt(expected_position)).all(), per_position


@pytest.mark.parametrize("head", ["ctc", "dag"])
def test_glancing_puts_the_aligned_target_tokens_into_the_input_at_the_drawn_positions(head):
    """The first pass lays y out (the head's FBA layout) and draws positions; the second pass's input holds the
    laid-out tokens exactly there and the upsampled source elsewhere; ratio 0 is the loss without glancing."""
    options = {"head": "dag", "graph_upsample_ratio": 3.0, "link_heads": 2} if head == "dag" else {"upsample_ratio": 3}
    options["attention_dropout"] = 0.0
    torch.manual_seed(1)
    model = tiny_model(dropout=0.0, **options)
    x, x_lengths = random_batch([5, 3, 4], 12)
    y, y_lengths = random_batch([4, 2, 5], 12)
    model.train()
    model.initialize(x, x_lengths, y, y_lengths)
    chosen, layout = glance(model, "src2tgt", x, x_lengths, y, y_lengths, 1.0, torch.Generator().manual_seed(3))
    assert int(chosen.sum()) > 0 and not bool((layout[chosen] == model.cfg.blank_id).any())
    upsampled, _ = model.head.upsample(x, x_lengths)
    seen = []
    hook = model.embed.register_forward_pre_hook(lambda module, args: seen.append(args[0]))
    model.embed_input(x, x_lengths, "src", glance=(chosen, layout))
    hook.remove()
    assert torch.equal(seen[0], torch.where(chosen, layout, upsampled))
    assert torch.equal(seen[0] != upsampled, chosen & (layout != upsampled))
    terms = DuplexLoss(model, LossConfig(glance_start=1.0, glance_end=1.0))(x, x_lengths, y, y_lengths, step=0)  # glancing in training: a finite loss with gradients
    terms["total"].backward()
    assert torch.isfinite(terms["total"]) and model.embed.weight.grad is not None
    plain = tiny_model(dropout=0.0, **options)
    plain.load_state_dict(model.state_dict())
    zero = tiny_model(dropout=0.0, **options)
    zero.load_state_dict(model.state_dict())
    no_glancing = DuplexLoss(zero, LossConfig(glance_start=0.0, glance_end=0.0))(x, x_lengths, y, y_lengths, step=5)
    assert torch.equal(no_glancing["total"], DuplexLoss(plain, LossConfig())(x, x_lengths, y, y_lengths, step=5)["total"])


def test_the_glancing_schedule_is_linear_then_constant_and_checked():
    config = LossConfig(glance_start=0.5, glance_end=0.1, glance_steps=200)
    assert [config.glance_ratio(step) for step in (0, 100, 200, 5000)] == pytest.approx([0.5, 0.3, 0.1, 0.1])
    assert LossConfig().glance_ratio(0) == 0.0 and LossConfig(glance_end=0.2).glance_ratio(0) == 0.2
    for overrides, message in (({"glance_start": 1.5}, "glance_start: must be a share from 0 to 1, got 1.5"),
                               ({"glance_end": -0.1}, "glance_end: must be a share"),
                               ({"glance_steps": -1}, "glance_steps")):
        with pytest.raises(FieldError, match=message):
            LossConfig(**overrides)


def test_teacher_objective_reads_the_batch_in_its_direction():
    model = Transformer(TransformerConfig(vocab_size=16, d_model=8, n_heads=2, ffn_dim=16, encoder_layers=1,
                                          decoder_layers=1, dropout=0.0, max_positions=32))
    src, src_lengths = pad_batch([[4, 5, 3], [6, 3]])
    tgt, tgt_lengths = pad_batch([[7, 3], [8, 9, 10, 3]])
    forward = TeacherObjective(model, "src2tgt")(src, src_lengths, tgt, tgt_lengths, 0)
    backward = TeacherObjective(model, "tgt2src")(src, src_lengths, tgt, tgt_lengths, 0)
    assert set(forward) == {"nll_src2tgt", "total"} and set(backward) == {"nll_tgt2src", "total"}
    torch.testing.assert_close(forward["total"], teacher_loss(model, src, src_lengths, tgt, tgt_lengths)["total"])
    torch.testing.assert_close(backward["nll_tgt2src"], teacher_loss(model, tgt, tgt_lengths, src, src_lengths)["nll"])


def test_cmlm_objective_trains_its_direction_on_its_own_kd_pairs():
    """src2tgt reads the batch (x, teacher(x)); tgt2src the KD reverse batch (teacher(y), y) backwards, i.e.
    y → teacher(y); without KD the references backwards."""
    from reder import CMLM, CmlmConfig

    model = CMLM(CmlmConfig(vocab_size=16, d_model=8, n_heads=2, ffn_dim=16, encoder_layers=1, decoder_layers=1,
                            dropout=0.0, max_positions=32))
    x, x_lengths = pad_batch([[4, 5, 3], [6, 3]])
    kd_y, kd_y_lengths = pad_batch([[7, 3], [8, 9, 10, 3]])
    kd_x, kd_x_lengths = pad_batch([[11, 12, 13, 3], [4, 3]])
    y, y_lengths = pad_batch([[7, 7, 3], [9, 3]])
    reverse = (kd_x, kd_x_lengths, y, y_lengths)
    for direction, expected in (("src2tgt", (x, x_lengths, kd_y, kd_y_lengths)), ("tgt2src", (y, y_lengths, kd_x, kd_x_lengths))):
        torch.manual_seed(3)
        terms = CmlmObjective(model, direction)(x, x_lengths, kd_y, kd_y_lengths, 0, tgt2src_batch=reverse)
        assert set(terms) == {f"nll_{direction}", f"length_{direction}", "total"}
        torch.manual_seed(3)  # the same masks
        torch.testing.assert_close(terms["total"], cmlm_loss(model, *expected)["total"])
    torch.manual_seed(3)
    plain = CmlmObjective(model, "tgt2src")(x, x_lengths, kd_y, kd_y_lengths, 0)
    torch.manual_seed(3)
    torch.testing.assert_close(plain["total"], cmlm_loss(model, kd_y, kd_y_lengths, x, x_lengths)["total"])
