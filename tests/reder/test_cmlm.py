"""The CMLM (reder/cmlm.py): uniform masking, the loss on masked positions, mask-predict against a plain
per-sentence loop (schedule, length beam, T = 1 as one parallel pass), refinement from a given hypothesis, and
a tiny model that learns to reverse sequences."""
import math

import pytest
import torch

from reder import EOS_ID, PAD_ID
from reder.cmlm import CMLM, remask
from reder.config import CmlmConfig
from reder.ctc import pad_batch, valid_mask
from reder.decoding.run import decode
from reder.objectives.directional import cmlm_loss
from reder.objectives.terms import uniform_mask
from tests.reder.helpers import random_batch

VOCAB = 14


def tiny_cmlm(**overrides) -> CMLM:
    values = dict(vocab_size=VOCAB, d_model=16, n_heads=2, ffn_dim=32, encoder_layers=2, decoder_layers=2,
                  dropout=0.0, attention_dropout=0.0, label_smoothing=0.1, max_positions=16)
    values.update(overrides)
    return CMLM(CmlmConfig(**values)).eval()


def test_remask_takes_the_lowest_scores_of_real_positions() -> None:
    scores = torch.tensor([[-0.1, -3.0, -0.5, -2.0, 9.0], [-1.0, -1.0, -0.2, -5.0, -9.0]])
    masked = remask(scores, torch.tensor([4, 3]), torch.tensor([2, 2]))
    assert masked.tolist() == [[False, True, False, True, False], [True, True, False, False, False]]


def test_loss_scores_only_the_masked_positions() -> None:
    torch.manual_seed(1)
    model = tiny_cmlm(label_smoothing=0.0).train()  # no dropout: the masks are the only randomness
    src, src_lengths = random_batch([5, 3, 7], VOCAB)
    tgt, tgt_lengths = random_batch([4, 6, 2], VOCAB)
    torch.manual_seed(7)
    terms = cmlm_loss(model, src, src_lengths, tgt, tgt_lengths)
    torch.manual_seed(7)  # the same draws: a reference computed by hand
    lengths = tgt_lengths - 1
    masked = uniform_mask(lengths, 5)
    target = tgt[:, :5].masked_fill(~valid_mask(lengths, 5), PAD_ID)
    memory, src_mask = model.encode(src, src_lengths)
    logits = model.decode(model.cross(memory), src_mask, target.masked_fill(masked, model.cfg.mask_id), lengths)
    picked = [torch.log_softmax(logits[b, i], dim=-1)[target[b, i]] for b, i in masked.nonzero().tolist()]
    nll = -sum(picked) / len(picked)
    length = -sum(model.length_log_probs(memory, src_mask)[b, int(n)] for b, n in enumerate(lengths)) / 3
    assert torch.allclose(terms["nll"], nll, atol=1e-5)
    assert torch.allclose(terms["length"], length, atol=1e-5)
    assert torch.allclose(terms["total"], nll + 0.1 * length, atol=1e-5)
    terms["total"].backward()
    assert model.length.weight.grad.abs().sum() > 0


def reference_mask_predict(model: CMLM, src: torch.Tensor, src_lengths: torch.Tensor, iterations: int,
                           length_beam: int) -> list[tuple[list[int], float]]:
    """Mask-predict as the paper writes it, one sentence and one candidate length at a time, in plain loops."""
    results = []
    for b in range(src.shape[0]):
        row, row_length = src[b : b + 1, : src_lengths[b]], src_lengths[b : b + 1]
        memory, src_mask = model.encode(row, row_length)
        length_scores = model.length_log_probs(memory, src_mask)[0].tolist()
        ranked = sorted(range(1, len(length_scores)), key=lambda n: -length_scores[n])[:length_beam]
        candidates = []
        for n in ranked:
            tokens, scores = [model.cfg.mask_id] * n, [0.0] * n
            for t in range(iterations):
                count = n if t == 0 else n * (iterations - t) // iterations
                chosen = sorted(range(n), key=lambda i: (scores[i], i))[:count]
                inputs = [model.cfg.mask_id if i in chosen else tokens[i] for i in range(n)]
                logits = model.decode(model.cross(memory), src_mask, torch.tensor([inputs]), torch.tensor([n]))[0]
                log_probs = torch.log_softmax(logits, dim=-1)
                log_probs[:, model.banned] = -math.inf
                for i in chosen:
                    scores[i], tokens[i] = log_probs[i].max().item(), log_probs[i].argmax().item()
            candidates.append((tokens, sum(scores) / n))
        results.append(max(candidates, key=lambda c: c[1]))  # max keeps the first of equals
    return results


@pytest.mark.parametrize("iterations,length_beam", [(1, 1), (1, 3), (2, 1), (3, 3), (5, 2), (10, 4)])
def test_mask_predict_matches_the_plain_loop(iterations: int, length_beam: int) -> None:
    torch.manual_seed(iterations * 10 + length_beam)
    model = tiny_cmlm()
    src, src_lengths = random_batch([5, 3, 7, 2, 6], VOCAB)
    with torch.no_grad():
        expected = reference_mask_predict(model, src, src_lengths, iterations, length_beam)
    got = model.mask_predict(src, src_lengths, iterations, length_beam)
    assert [tokens for tokens, _ in got] == [tokens for tokens, _ in expected]
    assert [score for _, score in got] == pytest.approx([score for _, score in expected], abs=1e-5)


def test_one_iteration_is_the_argmax_of_one_parallel_pass() -> None:
    model = tiny_cmlm()
    src, src_lengths = random_batch([5, 3, 7], VOCAB)
    with torch.no_grad():
        memory, src_mask = model.encode(src, src_lengths)
        length_scores = model.length_log_probs(memory, src_mask)
        lengths = length_scores[:, 1:].argmax(dim=1) + 1
        masks = torch.full((3, int(lengths.max())), model.cfg.mask_id)
        logits = model.decode(model.cross(memory), src_mask, masks, lengths)
        logits[..., model.banned] = -math.inf
        argmax = [logits[b, : lengths[b]].argmax(dim=-1).tolist() for b in range(3)]
    assert decode(model, src, src_lengths, "src2tgt", "mask_predict", length_beam=1, iterations=1) == argmax


def test_schedule_remasks_n_times_t_minus_t_over_t_tokens() -> None:
    model = tiny_cmlm()
    src, src_lengths = random_batch([5, 3, 7], VOCAB)
    lengths = torch.tensor([[5], [7], [2]])
    seen: list[list[int]] = []
    decode = model.decode

    def spy(cross, src_mask, tokens, row_lengths):
        seen.append(((tokens == model.cfg.mask_id) & valid_mask(row_lengths, tokens.shape[1])).sum(dim=1).tolist())
        return decode(cross, src_mask, tokens, row_lengths)

    model.decode = spy
    with torch.no_grad():
        memory, src_mask = model.encode(src, src_lengths)
        model.decode_lengths(memory, src_mask, lengths, iterations=4)
    # N·(T−t)/T for t = 0..3, rounded down; a pass runs while some row still re-masks
    assert seen == [[5, 7, 2], [3, 5, 1], [2, 3, 1], [1, 1, 0]]


def test_length_beam_keeps_the_best_candidate_of_the_single_lengths() -> None:
    torch.manual_seed(3)
    model = tiny_cmlm()
    src, src_lengths = random_batch([5, 3, 7, 4], VOCAB)
    with torch.no_grad():
        memory, src_mask = model.encode(src, src_lengths)
        candidates = model.candidate_lengths(memory, src_mask, 4)
        singles = [model.decode_lengths(memory, src_mask, candidates[:, j : j + 1], 3) for j in range(4)]
        beam = model.decode_lengths(memory, src_mask, candidates, 3)
    for b in range(4):
        best = max((singles[j][b] for j in range(4)), key=lambda c: c[1])
        assert beam[b][0] == best[0] and beam[b][1] == pytest.approx(best[1], abs=1e-5)
    assert len({len(tokens) for tokens, _ in beam}) > 1  # the candidates really differ in length


def test_refine_with_no_steps_returns_the_hypotheses() -> None:
    model = tiny_cmlm()
    src, src_lengths = random_batch([5, 3, 7], VOCAB)
    hypotheses = [[4, 5, 6], [], [7, 7, 7, 7, 9]]
    assert model.refine(src, src_lengths, hypotheses, 0) == hypotheses
    refined = model.refine(src, src_lengths, hypotheses, 2)
    assert [len(h) for h in refined] == [3, 0, 5]  # lengths kept, the empty one left alone
    with pytest.raises(ValueError, match="steps"):
        model.refine(src, src_lengths, hypotheses, -1)


def test_checkpoint_round_trip(tmp_path) -> None:
    from reder.checkpoint import load_cmlm_dir, load_model_dir, save_model_dir

    model = tiny_cmlm()
    (tmp_path / "spm.model").write_bytes(b"not read here")
    save_model_dir(tmp_path / "model", model, tmp_path / "spm.model", "en", "de", extra={"direction": "tgt2src"})
    loaded, meta = load_model_dir(tmp_path / "model")
    assert isinstance(loaded, CMLM) and meta["architecture"] == "cmlm" and loaded.cfg == model.cfg
    src, src_lengths = random_batch([5, 3], VOCAB)
    options = dict(length_beam=2, iterations=3)
    assert decode(loaded, src, src_lengths, "tgt2src", "mask_predict", **options) == decode(model, src, src_lengths, "tgt2src", "mask_predict", **options)
    assert isinstance(load_cmlm_dir(tmp_path / "model", "tgt2src", VOCAB), CMLM)
    with pytest.raises(ValueError, match="src2tgt"):
        load_cmlm_dir(tmp_path / "model", "src2tgt", VOCAB)


def reverse_task(count: int, generator: torch.Generator) -> tuple[list[list[int]], list[list[int]]]:
    sources = [torch.randint(4, VOCAB - 1, (int(torch.randint(3, 8, (1,), generator=generator)),),
                             generator=generator).tolist() for _ in range(count)]
    return sources, [s[::-1] for s in sources]


def test_a_tiny_cmlm_learns_to_reverse_and_refinement_repairs_a_corrupted_hypothesis() -> None:
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(0)
    model = tiny_cmlm(d_model=32, ffn_dim=64, encoder_layers=1, label_smoothing=0.0).train()
    optimizer = torch.optim.Adam(model.parameters(), lr=5e-3, betas=(0.9, 0.98))
    # lr decays linearly to 0: at a constant lr the result hung on the thread count's rounding (seed 0: 0.975 on
    # one thread, 0.75 on two; seeds 0-5 on 1 and 2 threads 0.75-1.0); decayed, 0.98-1.0 and repaired 0.985-1.0
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1 - step / 600)
    for _ in range(600):
        sources, targets = reverse_task(32, generator)
        src, src_lengths = pad_batch([s + [EOS_ID] for s in sources])
        tgt, tgt_lengths = pad_batch([t + [EOS_ID] for t in targets])
        loss = cmlm_loss(model, src, src_lengths, tgt, tgt_lengths)["total"]
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
    model.eval()
    sources, targets = reverse_task(200, torch.Generator().manual_seed(1))
    src, src_lengths = pad_batch([s + [EOS_ID] for s in sources])
    # one length candidate: trained on true lengths only, the model is as sure of a wrong length's tokens, so
    # the mean log-probability does not rank lengths here (it does rank candidates: test above)
    decoded = decode(model, src, src_lengths, "src2tgt", "mask_predict", length_beam=1, iterations=4)
    accuracy = sum(h == t for h, t in zip(decoded, targets)) / len(targets)
    assert accuracy >= 0.9, accuracy
    corrupted = [t[:1] + [4 + (t[1] - 3) % (VOCAB - 5)] + t[2:] for t in targets]  # the second token wrong
    refined = model.refine(src, src_lengths, corrupted, 2)
    repaired = sum(h == t for h, t in zip(refined, targets)) / len(targets)
    assert repaired >= 0.9, repaired
