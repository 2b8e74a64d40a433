"""The autoregressive Transformer (teacher and AR baseline): loss, cached decoding, greedy and beam search,
teacher reranking; and a slow test that a tiny teacher memorises 64 Multi30k pairs in both directions."""
import math
import time

import pytest
import sacrebleu
import torch
import torch.nn.functional as F

from reder import BOS_ID, EOS_ID, PAD_ID, TransformerConfig
from reder.autoregressive import Transformer
from reder.ctc import pad_batch
from reder.decoding.run import decode
from reder.objectives.directional import teacher_loss
from reder.rerank import rerank
from tests.reder.helpers import MULTI30K, WordPairs, random_batch

VOCAB = 14
LENGTHS = [5, 3, 7, 2, 9, 4, 6, 8]


def tiny_transformer(**overrides) -> Transformer:
    values = dict(vocab_size=VOCAB, d_model=16, n_heads=2, ffn_dim=32, encoder_layers=2, decoder_layers=2,
                  dropout=0.1, attention_dropout=0.1, label_smoothing=0.1, max_positions=64)
    values.update(overrides)
    return Transformer(TransformerConfig(**values))


def partly_trained(seed: int, steps: int = 40) -> Transformer:
    """A tiny model trained for a few steps to map each token through a permutation. A freshly initialised
    model repeats one token and never ends; this one ends at varied lengths and is unsure enough that beam
    search and greedy often disagree."""
    torch.manual_seed(seed)
    model = tiny_transformer(dropout=0.0, attention_dropout=0.0, label_smoothing=0.0)
    src, lengths = random_batch(torch.randint(2, 9, (32,)).tolist(), VOCAB)
    permutation = torch.randperm(VOCAB - 5) + 4
    real = (src >= 4) & (src < VOCAB - 1)
    tgt = src.clone()
    tgt[real] = permutation[src[real] - 4]
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(steps):
        loss = teacher_loss(model, src, lengths, tgt, lengths)["total"]
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model.eval()


@pytest.fixture(scope="module")
def models() -> list[Transformer]:
    return [partly_trained(seed) for seed in range(4)]


def _row(tokens: torch.Tensor, lengths: torch.Tensor, index: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Sentence `index` alone, without the batch's padding."""
    return tokens[index : index + 1, : lengths[index]], lengths[index : index + 1]


def _sum_log_prob(model: Transformer, src: torch.Tensor, src_lengths: torch.Tensor, hypothesis: list[int]) -> tuple[float, int]:
    """Teacher-forced sum of token log-probs of hypothesis + EOS, and its length with EOS."""
    tgt, tgt_lengths = pad_batch([hypothesis + [EOS_ID]])
    return model.score(src, src_lengths, tgt, tgt_lengths).item() * len(hypothesis + [EOS_ID]), len(hypothesis) + 1


def test_config_checks_values_and_round_trips():
    cfg = TransformerConfig(vocab_size=20, d_model=32, n_heads=4)
    assert cfg.blank_id == 19
    assert TransformerConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ValueError, match="unknown keys \\['layers'\\]"):
        TransformerConfig.from_dict({"layers": 3})
    for bad, message in [({"d_model": 30, "n_heads": 4}, r"^n_heads: must be a positive divisor of d_model \(30\), got 4$"),
                         ({"d_model": 33, "n_heads": 1}, r"^d_model: must be even .*, got 33$"),
                         ({"label_smoothing": 1.0}, r"^label_smoothing: must be in \[0, 1\), got 1\.0$"),
                         ({"vocab_size": 4}, r"^vocab_size: must be > 4 .*, got 4$"),
                         ({"decoder_layers": 0}, r"^decoder_layers: must be >= 1, got 0$")]:
        with pytest.raises(ValueError, match=message):
            TransformerConfig(**bad)


def test_loss_matches_the_textbook_label_smoothed_cross_entropy():
    model = tiny_transformer(label_smoothing=0.2).double().eval()
    src, src_lengths = random_batch([5, 3, 6], VOCAB)
    tgt, tgt_lengths = random_batch([4, 6, 2], VOCAB)
    terms = teacher_loss(model, src, src_lengths, tgt, tgt_lengths)
    prev = torch.full_like(tgt, PAD_ID)  # [BOS, y_1 … y_{T−1}], built here token by token
    for row, length in enumerate(tgt_lengths.tolist()):
        prev[row, 0] = BOS_ID
        prev[row, 1:length] = tgt[row, : length - 1]
    logits = model.decoder_logits(*model.encode(src, src_lengths), prev)  # (B, T, V)
    nll, smoothed, count = 0.0, 0.0, 0
    for row, length in enumerate(tgt_lengths.tolist()):
        for position in range(length):
            log_probs = logits[row, position].log_softmax(-1)
            target = torch.full((VOCAB,), 0.2 / VOCAB, dtype=torch.float64)  # q = (1−ε)·one-hot + ε·uniform
            target[tgt[row, position]] += 0.8
            nll -= log_probs[tgt[row, position]].item()
            smoothed -= (target * log_probs).sum().item()
            count += 1
    assert terms["nll"].item() == pytest.approx(nll / count, rel=1e-12)
    assert terms["total"].item() == pytest.approx(smoothed / count, rel=1e-12)
    flat_logits, flat_targets = logits.flatten(0, 1), tgt.flatten()
    assert terms["nll"].item() == pytest.approx(F.cross_entropy(flat_logits, flat_targets, ignore_index=PAD_ID).item(), rel=1e-12)
    # this formula, (1−ε)·nll + ε·mean_v(−log p_v), is also PyTorch's label_smoothing
    reference = F.cross_entropy(flat_logits, flat_targets, ignore_index=PAD_ID, label_smoothing=0.2)
    assert terms["total"].item() == pytest.approx(reference.item(), rel=1e-12)
    teacher_loss(model.train(), src, src_lengths, tgt, tgt_lengths)["total"].backward()
    assert model.embed.weight.grad.abs().sum() > 0


def test_score_is_the_mean_log_prob_of_step_by_step_decoding():
    model = tiny_transformer().double().eval()
    src, src_lengths = random_batch([5, 3, 6], VOCAB)
    tgt, tgt_lengths = random_batch([4, 6, 2], VOCAB)
    scores = model.score(src, src_lengths, tgt, tgt_lengths)
    for row in range(3):
        cache = model.start(*model.encode(*_row(src, src_lengths, row)))
        total, previous = 0.0, BOS_ID
        for token in tgt[row, : tgt_lengths[row]].tolist():
            total += model.step(torch.tensor([previous]), cache).log_softmax(-1)[0, token].item()
            previous = token
        assert scores[row].item() == pytest.approx(total / tgt_lengths[row].item(), rel=1e-10)


@pytest.mark.parametrize("dtype, tolerance", [(torch.float64, 1e-10), (torch.float32, 1e-5)])
def test_cached_decoding_equals_full_recomputation(dtype, tolerance):
    model = tiny_transformer().to(dtype).eval()
    src, src_lengths = random_batch([5, 2, 7, 4], VOCAB)
    prev, _ = random_batch([6, 3, 6, 1], VOCAB)  # padded prefixes: some rows run into their padding
    prev[:, 0] = BOS_ID
    memory, src_mask = model.encode(src, src_lengths)
    full = model.decoder_logits(memory, src_mask, prev)  # (B, T, V)
    cache = model.start(memory, src_mask)
    for position in range(3):
        torch.testing.assert_close(model.step(prev[:, position], cache), full[:, position], rtol=0, atol=tolerance)
    # reorder the rows mid-way (as beam reselection does) and go on: equal to recomputing the reordered batch
    order = torch.tensor([2, 0, 0, 3])
    cache.select(order, memory=True)
    reordered = model.decoder_logits(memory[order], src_mask[order], prev[order])
    for position in range(3, prev.shape[1]):
        torch.testing.assert_close(model.step(prev[order, position], cache), reordered[:, position], rtol=0, atol=tolerance)
    assert cache.length == prev.shape[1]


def test_teacher_forcing_uses_sdpas_causal_flag_and_equals_the_explicit_causal_mask(monkeypatch):
    """The decoder's self-attention under teacher forcing passes no mask tensor, SDPA's
    `is_causal` instead (fused GPU kernels take it; a boolean mask tensor may cost a kernel plan per shape), and
    its loss and gradients are those of the explicit lower-triangular boolean mask it replaced, bit for bit on CPU."""
    model = tiny_transformer(dropout=0.0, attention_dropout=0.0)
    src, src_lengths = random_batch([5, 2, 7, 4], VOCAB)
    tgt, tgt_lengths = random_batch([6, 3, 6, 1], VOCAB)
    real = F.scaled_dot_product_attention
    calls = []

    def spy(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, **kwargs):
        calls.append((attn_mask is None, is_causal))
        return real(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, **kwargs)

    def explicit(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, **kwargs):  # the mask from before
        if is_causal:
            attn_mask = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril()
        return real(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, **kwargs)

    results = []
    for attention in (spy, explicit):
        monkeypatch.setattr(F, "scaled_dot_product_attention", attention)
        model.zero_grad()
        loss = teacher_loss(model, src, src_lengths, tgt, tgt_lengths)["total"]
        loss.backward()
        results.append((loss.detach(), [p.grad.clone() for p in model.parameters()]))
    # 2 encoder layers (key mask), then per decoder layer: self-attention (causal flag), cross-attention (key mask)
    assert calls == [(False, False)] * 2 + [(True, True), (False, False)] * 2
    assert torch.equal(results[0][0], results[1][0])
    assert all(torch.equal(a, b) for a, b in zip(results[0][1], results[1][1]))


def test_beam_one_is_exactly_greedy(models):
    src, src_lengths = random_batch(LENGTHS, VOCAB)
    for model in [*models, tiny_transformer().eval()]:
        greedy = model.greedy(src, src_lengths)
        assert [h for h, _ in model.beam_search(src, src_lengths, beam_size=1)] == greedy
        assert decode(model, src, src_lengths, "src2tgt", "beam", beam_size=1) == greedy  # the beam decoder too
        assert decode(model, src, src_lengths, "src2tgt", "greedy") == greedy
        if model in models:  # outputs that end by themselves, at lengths that vary: not a trivial comparison
            assert len({len(h) for h in greedy}) > 2 and min(map(len, greedy)) < int(1.2 * min(LENGTHS) + 10) - 1


def test_outputs_do_not_depend_on_the_rest_of_the_batch(models):
    src, src_lengths = random_batch(LENGTHS, VOCAB)
    for model in models:
        batched = model.beam_search(src, src_lengths, beam_size=3, length_penalty=0.8)
        greedy = model.greedy(src, src_lengths)
        for index in range(len(LENGTHS)):
            ((alone, score),) = model.beam_search(*_row(src, src_lengths, index), beam_size=3, length_penalty=0.8)
            assert batched[index][0] == alone and batched[index][1] == pytest.approx(score, abs=1e-5)
            assert greedy[index] == model.greedy(*_row(src, src_lengths, index))[0]


@pytest.mark.parametrize("length_penalty", [1.0, 0.6, 0.0])
def test_beam_score_is_the_models_own_score_and_not_below_greedy(models, length_penalty):
    improved = 0
    for seed, model in enumerate(models):
        torch.manual_seed(100 + seed)
        src, src_lengths = random_batch(LENGTHS, VOCAB)
        greedy = model.greedy(src, src_lengths)
        for index, (hypothesis, score) in enumerate(model.beam_search(src, src_lengths, beam_size=4, length_penalty=length_penalty)):
            total, length = _sum_log_prob(model, *_row(src, src_lengths, index), hypothesis)
            assert score == pytest.approx(total / length**length_penalty, rel=1e-5)
            greedy_total, greedy_length = _sum_log_prob(model, *_row(src, src_lengths, index), greedy[index])
            greedy_score = greedy_total / greedy_length**length_penalty
            assert score >= greedy_score - 1e-5 * abs(greedy_score)
            improved += score > greedy_score + 1e-4
    assert improved >= 5  # the search does find better hypotheses than greedy on these models


def _bigram_model(rows: dict[int, dict[int, float]]) -> Transformer:
    """A model whose next-token distribution depends on the previous token only: rows[previous] = {token: p}."""
    model = tiny_transformer().eval()
    table = torch.full((VOCAB, VOCAB), -30.0)
    for previous, probabilities in rows.items():
        for token, probability in probabilities.items():
            table[previous, token] = math.log(probability)
    model.step = lambda tokens, cache: table[tokens]
    return model


def test_the_greedy_path_survives_pruning():
    """A bigram "model" whose greedy path falls out of a beam of 2 after one step: the greedy row keeps it."""
    rows = {BOS_ID: {4: 0.5, 5: 0.3, 6: 0.2},
            4: {t: 1 / 6 for t in range(7, 13)},  # greedy takes 7, the first of equals: sum ln .5 + ln 1/6 = −2.48
            7: {EOS_ID: 1.0},  # greedy = [4, 7], score −2.48 / 3
            5: {8: 0.5, 9: 0.5}}  # 5→8 and 5→9 (−1.90 each) outrank every extension of 4: the greedy path is pruned
    rows.update({t: {EOS_ID: 0.3, 10: 0.25, 11: 0.25, 12: 0.2} for t in (6, 8, 9, 10, 11, 12)})
    model = _bigram_model(rows)
    src, src_lengths = random_batch([4], VOCAB)
    assert model.greedy(src, src_lengths) == [[4, 7]]
    ((hypothesis, score),) = model.beam_search(src, src_lengths, beam_size=2)
    assert hypothesis == [4, 7] and score == pytest.approx((math.log(0.5) + math.log(1 / 6)) / 3, abs=1e-6)
    # what the beam itself finished, [5, 8] and [5, 9] at (ln .3 + ln .5 + ln .3) / 3, scores lower
    assert (math.log(0.3) + math.log(0.5) + math.log(0.3)) / 3 < score


def test_search_goes_on_while_a_live_beam_can_still_win():
    """Beam 2 has two finished hypotheses after step 1 ([] and [5]; greedy, [], is done too), where fairseq stops;
    the live beam [4, 6] already averages better than the worse of them, so the search goes on and finds [4, 6]."""
    model = _bigram_model({BOS_ID: {EOS_ID: 0.4, 4: 0.35, 5: 0.25},
                           4: {6: 0.8, EOS_ID: 0.2}, 5: {EOS_ID: 0.9, 7: 0.1},
                           6: {EOS_ID: 0.95, 8: 0.05}, 7: {EOS_ID: 1.0}, 8: {EOS_ID: 1.0}})
    src, src_lengths = random_batch([4], VOCAB)
    assert model.greedy(src, src_lengths) == [[]]
    ((hypothesis, score),) = model.beam_search(src, src_lengths, beam_size=2)
    assert hypothesis == [4, 6] and score == pytest.approx(math.log(0.35 * 0.8 * 0.95) / 3, abs=1e-6)


def test_specials_are_never_generated_and_lengths_are_capped():
    model = tiny_transformer().eval()
    boost = torch.zeros(VOCAB)
    boost[[PAD_ID, BOS_ID, model.cfg.blank_id]] = 50.0  # without the ban these would win every step
    boost[EOS_ID] = -50.0  # and EOS would never come unless forced
    model.step = lambda tokens, cache: Transformer.step(model, tokens, cache) + boost
    src, src_lengths = random_batch([5, 2, 7], VOCAB)
    outputs = [model.greedy(src, src_lengths), decode(model, src, src_lengths, "src2tgt", "beam", beam_size=3)]
    for hypotheses in outputs:
        assert [len(h) for h in hypotheses] == [int(1.2 * n + 10) - 1 for n in (5, 2, 7)]  # EOS forced at the limit
        assert all(t not in (PAD_ID, BOS_ID, EOS_ID, model.cfg.blank_id) for h in hypotheses for t in h)
    assert [len(h) for h in decode(model, src, src_lengths, "src2tgt", "beam", beam_size=2, max_len_a=0.5, max_len_b=1)] == [2, 1, 3]
    assert [len(h) for h in decode(model, src, src_lengths, "src2tgt", "greedy", max_len_a=0.5, max_len_b=1)] == [2, 1, 3]


def test_inputs_longer_than_max_positions_are_refused():
    model = tiny_transformer(max_positions=8).eval()
    assert model.max_input_length() == 8
    src, src_lengths = random_batch([9, 3], VOCAB)
    with pytest.raises(ValueError, match="9 positions exceeds max_positions=8"):
        decode(model, src, src_lengths, "src2tgt", "beam")
    short, short_lengths = random_batch([8, 3], VOCAB)
    assert all(len(h) <= 7 for h in decode(model, short, short_lengths, "src2tgt", "beam", beam_size=2, max_len_b=50))  # outputs capped too


def test_rerank_picks_the_teachers_favourite_in_one_forward_pass():
    teacher = tiny_transformer().double().eval()
    src, src_lengths = random_batch([5, 3, 6], VOCAB)
    candidates = [[[4, 5, 6], [7], [8, 9, 10, 11], []], [[12, 4]], [[5, 5], [6, 7, 8], [9]]]
    calls = {"encoder": 0, "decoder": 0}
    hooks = [teacher.encoder_norm.register_forward_hook(lambda *_: calls.__setitem__("encoder", calls["encoder"] + 1)),
             teacher.decoder_norm.register_forward_hook(lambda *_: calls.__setitem__("decoder", calls["decoder"] + 1))]
    chosen = rerank(teacher, src, src_lengths, candidates)
    assert calls == {"encoder": 1, "decoder": 1}
    for hook in hooks:
        hook.remove()
    for index, options in enumerate(candidates):
        scores = [teacher.score(*_row(src, src_lengths, index), *pad_batch([option + [EOS_ID]])).item() for option in options]
        assert chosen[index] == options[max(range(len(options)), key=scores.__getitem__)]
        assert len(set(scores)) == len(scores)  # no ties: the check above is decisive
    twins = [[4, 5], [4, 5]]
    assert rerank(teacher, src[:1], src_lengths[:1], [twins])[0] is twins[0]  # ties go to the earlier candidate
    with pytest.raises(ValueError, match="sentences \\[1\\] have no candidates"):
        rerank(teacher, src[:2], src_lengths[:2], [[[4]], []])


TIME_LIMIT_S = 40  # per direction


@pytest.mark.slow
@pytest.mark.timed
@pytest.mark.skipif(not MULTI30K.is_dir(), reason=f"{MULTI30K} is absent")
def test_teachers_memorise_64_multi30k_pairs_in_both_directions():
    data = WordPairs()
    cfg = TransformerConfig(vocab_size=data.vocab_size, d_model=128, n_heads=4, ffn_dim=256, encoder_layers=2,
                            decoder_layers=2, dropout=0.0, label_smoothing=0.0)
    sides = {"src2tgt": (data.encode(data.english), data.german), "tgt2src": (data.encode(data.german), data.english)}
    scores = {}
    for direction, ((src, src_lengths), references) in sides.items():
        tgt, tgt_lengths = sides["tgt2src" if direction == "src2tgt" else "src2tgt"][0]
        model = Transformer(cfg).train()
        optimizer = torch.optim.Adam(model.parameters(), lr=2e-3, betas=(0.9, 0.98))
        start, step = time.monotonic(), 0
        while time.monotonic() - start < TIME_LIMIT_S:
            terms = teacher_loss(model, src, src_lengths, tgt, tgt_lengths)
            optimizer.zero_grad()
            terms["total"].backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            step += 1
            if step % 25 == 0 or terms["nll"].item() < 0.01:
                decoded = decode(model.eval(), src, src_lengths, direction, "beam", beam_size=4)
                hypotheses = [data.decode(h) for h in decoded]
                model.train()
                scores[direction] = sacrebleu.corpus_bleu(hypotheses, [references]).score
                print(direction, step, f"{time.monotonic() - start:.0f}s", f"nll {terms['nll'].item():.4f}", f"BLEU {scores[direction]:.1f}")
                if scores[direction] > 90:
                    break
    assert min(scores.values()) > 90, scores


@pytest.mark.gpu
def test_cuda_decoding_and_scores_match_the_cpu(models):
    """The same teacher on the GPU: identical greedy and beam outputs, beam scores and rerank scores to
    float32 rounding, and bf16-autocast training steps that stay finite."""
    src, src_lengths = random_batch(LENGTHS, VOCAB)
    for model in models:
        on_gpu = Transformer(model.cfg).cuda().eval()
        on_gpu.load_state_dict(model.state_dict())
        gpu_src, gpu_lengths = src.cuda(), src_lengths.cuda()
        assert on_gpu.greedy(gpu_src, gpu_lengths) == model.greedy(src, src_lengths)
        cpu_beam, gpu_beam = model.beam_search(src, src_lengths, 4), on_gpu.beam_search(gpu_src, gpu_lengths, 4)
        assert [h for h, _ in gpu_beam] == [h for h, _ in cpu_beam]
        assert [s for _, s in gpu_beam] == pytest.approx([s for _, s in cpu_beam], abs=1e-4)
        tgt, tgt_lengths = pad_batch([h + [EOS_ID] for h, _ in cpu_beam])
        torch.testing.assert_close(on_gpu.score(gpu_src, gpu_lengths, tgt.cuda(), tgt_lengths.cuda()).cpu(),
                                   model.score(src, src_lengths, tgt, tgt_lengths), atol=1e-4, rtol=1e-4)
        on_gpu.train()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = teacher_loss(on_gpu, gpu_src, gpu_lengths, tgt.cuda(), tgt_lengths.cuda())["total"]
        loss.backward()
        assert torch.isfinite(loss) and all(torch.isfinite(p.grad).all() for p in on_gpu.parameters() if p.grad is not None)
