"""NMLA's bag-of-n-grams loss over CTC's alignments and the other techniques of "REDER at its teachers' level"
(glancing blank-aligned frames), against brute force over every alignment."""
import itertools
import math
from collections import Counter

import pytest
import torch

from pipeline.config import PipelineConfig, load_config
from reder import DuplexLoss, LossConfig
from reder.configio import ConfigError, FieldError
from reder.ctc import pad_batch
from reder.objectives.duplex import glance
from reder.objectives.terms import ctc_ngram_loss, expected_ngram_counts
from tests.reder.helpers import random_batch, tiny_model

BLANK = 3


def collapse(alignment: tuple[int, ...]) -> list[int]:
    out, previous = [], None
    for token in alignment:
        if token != previous and token != BLANK:
            out.append(token)
        previous = token
    return out


def brute_force(log_probs: torch.Tensor, length: int, n: int) -> tuple[Counter, float]:
    """Every alignment of one sentence's first `length` frames: the expected count of each n-gram of the collapsed
    output, and the expected number of n-grams."""
    expected, total = Counter(), 0.0
    for alignment in itertools.product(range(log_probs.shape[-1]), repeat=length):
        p = math.exp(sum(log_probs[t, a].item() for t, a in enumerate(alignment)))
        output = collapse(alignment)
        for gram in zip(*[output[k:] for k in range(n)]):
            expected[gram] += p
        total += p * max(len(output) - n + 1, 0)
    return expected, total


@pytest.mark.parametrize("n", [1, 2])
def test_expected_ngram_counts_equal_the_sum_over_every_alignment(n):
    torch.manual_seed(n)
    log_probs = torch.randn(3, 6, 4, dtype=torch.float64).log_softmax(-1)
    log_probs[2, :, 0] += 3.0  # a repeated token likely: "a a" merges, "a _ a" does not
    log_probs = log_probs.log_softmax(-1)
    lengths = torch.tensor([6, 4, 5])
    grams = torch.tensor(list(itertools.product(range(BLANK), repeat=n)))  # every n-gram of word pieces
    expected, total = expected_ngram_counts(log_probs, lengths, grams[None].expand(3, -1, -1), BLANK, n)
    for b, length in enumerate(lengths.tolist()):
        reference, reference_total = brute_force(log_probs[b], length, n)
        for j, gram in enumerate(grams.tolist()):
            assert abs(expected[b, j].item() - reference[tuple(gram)]) < 1e-12, (b, gram)
        assert abs(total[b].item() - reference_total) < 1e-12


def test_the_nmla_loss_is_one_minus_the_ngram_f_measure_of_the_expected_counts():
    """loss = 1 − 2·Σ_g min(C_θ(g), C_y(g)) / (T_θ + T_y), the mean over samples with an n-gram, for n = 1 and 2
    (targets with a repeated bigram and one without any bigram, which is left out of the mean)."""
    torch.manual_seed(0)
    log_probs = torch.randn(3, 5, 4, dtype=torch.float64, requires_grad=True)
    lengths = torch.tensor([5, 5, 4])
    targets, target_lengths = pad_batch([[0, 1, 0, 1], [2, 2, 1], [1]])
    for n in (1, 2):
        value = ctc_ngram_loss(log_probs.log_softmax(-1), lengths, targets, target_lengths, BLANK, n)
        losses = []
        for b in range(3):
            target = targets[b, : target_lengths[b]].tolist()
            reference = Counter(zip(*[target[k:] for k in range(n)]))
            if not reference:
                continue
            expected, total = brute_force(log_probs.log_softmax(-1)[b].detach(), int(lengths[b]), n)
            match = sum(min(expected[g], count) for g, count in reference.items())
            losses.append(1 - 2 * match / (total + sum(reference.values())))
        assert abs(value.item() - sum(losses) / len(losses)) < 1e-12, n
        value.backward()
        assert torch.isfinite(log_probs.grad).all() and log_probs.grad.abs().sum() > 0
        log_probs.grad = None


def test_an_output_certain_of_the_target_has_loss_zero_and_one_that_never_emits_it_loss_one():
    target = [0, 1, 1, 2]
    alignment = [0, 1, BLANK, 1, 2, 2]  # "1 _ 1" keeps both 1s; "2 2" is one 2
    certain = torch.full((1, 6, 4), -60.0, dtype=torch.float64)
    certain[0, torch.arange(6), alignment] = 0.0
    targets, target_lengths = pad_batch([target])
    for n in (1, 2):
        assert ctc_ngram_loss(certain, torch.tensor([6]), targets, target_lengths, BLANK, n).item() < 1e-9
    blanks = torch.full((1, 6, 4), -60.0, dtype=torch.float64)
    blanks[..., BLANK] = 0.0
    assert abs(ctc_ngram_loss(blanks, torch.tensor([6]), targets, target_lengths, BLANK, 2).item() - 1.0) < 1e-9


def test_nmla_replaces_the_ctc_term_from_its_start_step_and_keeps_ctc_at_its_weight():
    torch.manual_seed(0)
    model = tiny_model(dropout=0.0, attention_dropout=0.0).train()
    x, x_lengths = random_batch([5, 3], 12)
    y, y_lengths = random_batch([4, 2], 12)
    config = LossConfig(lambda_fba=0.0, lambda_cc=0.0, nmla_start_step=3)
    before = DuplexLoss(model, config)(x, x_lengths, y, y_lengths, 2)
    after = DuplexLoss(model, config)(x, x_lengths, y, y_lengths, 3)
    assert set(before) == {"ctc_src2tgt", "ctc_tgt2src", "total"}
    assert set(after) == {"nmla_src2tgt", "nmla_tgt2src", "total"}
    assert 0.0 <= after["nmla_src2tgt"].item() <= 1.0
    torch.testing.assert_close(after["total"], after["nmla_src2tgt"] + after["nmla_tgt2src"])
    both = DuplexLoss(model, LossConfig(0.0, 0.0, nmla_start_step=0, nmla_ctc_weight=0.5))(x, x_lengths, y, y_lengths, 0)
    torch.testing.assert_close(both["ctc_src2tgt"], before["ctc_src2tgt"])
    torch.testing.assert_close(both["total"], both["nmla_src2tgt"] + both["nmla_tgt2src"]
                               + 0.5 * (both["ctc_src2tgt"] + both["ctc_tgt2src"]))
    both["total"].backward()
    assert model.embed.weight.grad is not None and torch.isfinite(model.embed.weight.grad).all()
    dag = tiny_model(head="dag", graph_upsample_ratio=3.0, link_heads=2)
    with pytest.raises(ValueError, match="NMLA is a loss over CTC's alignments"):
        DuplexLoss(dag, LossConfig(nmla_start_step=0))(x, x_lengths, y, y_lengths, 0)


def test_glancing_blanks_draws_among_blank_aligned_frames_too():
    """GLAT draws n = ⌊ratio · (wrong candidates) + 0.5⌋ of the candidate frames: without `blanks` the frames
    aligned to word pieces, with it the blank-aligned ones too (targets with repeats force blanks between them)."""
    torch.manual_seed(2)
    model = tiny_model(dropout=0.0, attention_dropout=0.0, upsample_ratio=3).train()
    x, x_lengths = random_batch([5, 4], 12)
    y, y_lengths = pad_batch([[5, 5, 6, 2], [4, 4, 2]])  # 2: EOS
    model.initialize(x, x_lengths, y, y_lengths)
    with torch.no_grad():
        predicted = model.outputs(x, x_lengths, "src2tgt").log_probs.argmax(-1)
    drawn = {False: torch.zeros(2, 15, dtype=torch.bool), True: torch.zeros(2, 15, dtype=torch.bool)}
    for seed in range(40):
        for blanks in (False, True):
            chosen, layout = glance(model, "src2tgt", x, x_lengths, y, y_lengths, 0.5,
                                    torch.Generator().manual_seed(seed), blanks=blanks)
            candidates = layout != 0  # every valid frame of these feasible samples
            if not blanks:
                candidates &= layout != model.cfg.blank_id
            wrong = (candidates & (predicted != layout)).sum(dim=1)
            assert chosen.sum(dim=1).tolist() == torch.floor(0.5 * wrong + 0.5).long().tolist()
            assert not bool((chosen & ~candidates).any())
            drawn[blanks] |= chosen
    blank_aligned = layout == model.cfg.blank_id
    assert bool(blank_aligned.any()) and bool((drawn[True] & blank_aligned).any())
    assert not bool((drawn[False] & blank_aligned).any())


def test_the_new_loss_keys_are_checked_and_nmla_needs_a_ctc_head(tmp_path):
    with pytest.raises(FieldError, match="nmla_ngram"):
        LossConfig(nmla_ngram=3)
    with pytest.raises(FieldError, match="glance_blanks"):
        LossConfig(glance_blanks="yes")
    with pytest.raises(FieldError, match="nmla_start_step"):
        LossConfig(nmla_start_step=-1)
    assert not LossConfig().nmla(10**9) and LossConfig(nmla_start_step=5).nmla(5) and not LossConfig(nmla_start_step=5).nmla(4)
    path = tmp_path / "c.yaml"
    path.write_text("model: {head: dag}\nloss: {nmla_start_step: 10}\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="NMLA is a loss over CTC's alignments"):
        load_config(path)
    assert isinstance(load_config(path, ["model.head=ctc"]), PipelineConfig)


def test_a_start_as_a_fraction_of_the_run_is_checked_and_excludes_a_start_step(tmp_path):
    """loss.nmla_start_fraction: from 0 up to 1, not a bool, and not beside nmla_start_step; either one means NMLA
    is used (the config refuses it for a DAG head by the key given); the objective itself switches on nmla_start_step
    only (the trainer turns the fraction into a step: tests/pipeline/test_harness.py)."""
    assert LossConfig(nmla_start_fraction=0.8).uses_nmla() and LossConfig(nmla_start_step=3).uses_nmla()
    assert not LossConfig().uses_nmla() and not LossConfig(nmla_start_fraction=0.0).nmla(10**9)
    for bad in (1.0, -0.1, True, "0.5"):
        with pytest.raises(FieldError, match="nmla_start_fraction: must be a fraction from 0 up to"):
            LossConfig(nmla_start_fraction=bad)
    with pytest.raises(FieldError, match="nmla_start_fraction: is 0.5 and nmla_start_step 3: NMLA starts at one of them"):
        LossConfig(nmla_start_fraction=0.5, nmla_start_step=3)
    path = tmp_path / "c.yaml"
    path.write_text("model: {head: dag}\nloss: {nmla_start_fraction: 0.8}\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="c.yaml:2: loss.nmla_start_fraction: NMLA is a loss over CTC's alignments"):
        load_config(path)
