"""Self-reranking (reder/rerank.py): the batched reverse pass against an unbatched per-candidate computation;
weight 0 is the plain beam; candidates that cannot be read back score −inf. (Teacher reranking:
tests/reder/test_autoregressive.py.)"""
import math

import pytest
import torch
import torch.nn.functional as F

from reder.config import EOS_ID
from reder.config import REVERSE
from reder.rerank import pick, reconstruction_scores, self_rerank
from reder.decoding.ctc import nbest as ctc_nbest
from reder.decoding.run import translate_ids
from tests.reder.helpers import decoding_model, random_batch
from tests.reder.test_checkpoint import _initialized


def _direct(model, source: list[int], candidate: list[int], direction: str) -> float:
    """log P(x | ŷ) / |x| with ŷ alone through the reverse direction and the full-vocabulary F.ctc_loss."""
    log_probs, lengths = model(torch.tensor([candidate + [EOS_ID]]), torch.tensor([len(candidate) + 1]), REVERSE[direction])
    nll = F.ctc_loss(log_probs.transpose(0, 1).float(), torch.tensor([source]), lengths, torch.tensor([len(source)]),
                     blank=model.cfg.blank_id, reduction="sum")
    return -nll.item() / len(source)


@pytest.mark.parametrize("direction", ["src2tgt", "tgt2src"])
def test_batched_reverse_scores_and_picks_equal_a_direct_per_candidate_computation(direction):
    model = _initialized(0)
    tokens, lengths = random_batch([7, 2, 5, 4], 12)
    nbest = ctc_nbest(model, tokens, lengths, direction, beam_size=6)
    batched = reconstruction_scores(model, tokens, lengths, direction, [[ids for ids, _ in e] for e in nbest])
    changed = 0
    for row, (entries, scores) in enumerate(zip(nbest, batched)):
        source = tokens[row, : lengths[row]].tolist()
        direct = [_direct(model, source, ids, direction) for ids, _ in entries]
        assert all(a == pytest.approx(b, abs=1e-5) or a == b == -math.inf
                                        for a, b in zip(scores, direct))
        for weight in (0.5, 2.0):
            totals = [forward + weight * back for (_, forward), back in zip(entries, direct)]
            chosen = self_rerank(model, tokens[row : row + 1], lengths[row : row + 1], direction, [entries], weight)[0]
            assert chosen == entries[max(range(len(totals)), key=totals.__getitem__)][0]
            changed += chosen != entries[0][0]
    assert max(map(len, nbest)) > 2 and changed > 0  # the reverse score does change some choices
    picks = self_rerank(model, tokens, lengths, direction, nbest, 2.0)  # the whole batch in one pass: the same
    assert picks == [self_rerank(model, tokens[r : r + 1], lengths[r : r + 1], direction, [nbest[r]], 2.0)[0] for r in range(4)]


def test_weight_zero_is_the_plain_beam_and_translate_ids_reranks():
    model = _initialized(0)
    sequences = [random_batch([n], 12)[0][0].tolist() for n in (6, 3, 5, 2, 4)]
    plain = translate_ids(model, sequences, "src2tgt", "beam", batch_size=2, beam_size=5)
    assert translate_ids(model, sequences, "src2tgt", "beam", batch_size=2, beam_size=5, rerank="self",
                         rerank_weight=0.0) == plain
    assert translate_ids(model, sequences, "src2tgt", "beam", batch_size=2, beam_size=5, rerank="none") == plain
    reranked = translate_ids(model, sequences, "src2tgt", "beam", batch_size=2, beam_size=5, rerank="self", rerank_weight=3.0)
    manual = []
    for sequence in sequences:
        tokens, lengths = torch.tensor([sequence]), torch.tensor([len(sequence)])
        manual += self_rerank(model, tokens, lengths, "src2tgt", ctc_nbest(model, tokens, lengths, "src2tgt", 5), 3.0)
    assert reranked == manual
    # self reranking is the CTC beam's: greedy takes no reranker, nor does a DAG model's beam
    with pytest.raises(ValueError, match=r"decoder 'greedy' of ctc: unknown options \['rerank'\]"):
        translate_ids(model, sequences, "src2tgt", rerank="self")
    with pytest.raises(ValueError, match=r"decoder 'beam' of dag: unknown options \['rerank'\]"):
        translate_ids(decoding_model("dag"), sequences, "src2tgt", "beam", beam_size=3, rerank="self")
    with pytest.raises(ValueError, match="rerank='teacher' needs a teacher"):
        translate_ids(model, sequences, "src2tgt", "beam", beam_size=3, rerank="teacher")
    with pytest.raises(ValueError, match=r"^decoder 'beam': rerank_weight must be >= 0, got -1\.0$"):
        translate_ids(model, sequences, "src2tgt", "beam", beam_size=3, rerank="self", rerank_weight=-1.0)
    with pytest.raises(ValueError, match=r"^decoder 'beam': rerank must be one of \['none', 'self', 'teacher'\], got 'reverse'$"):
        translate_ids(model, sequences, "src2tgt", "beam", beam_size=3, rerank="reverse")


def test_candidates_that_cannot_be_read_back_score_minus_infinity():
    model = _initialized(0)
    limit = model.max_input_length()
    tokens, lengths = random_batch([4], 12)
    too_long, short = [5] * limit, []  # ŷ + EOS over the limit; an empty ŷ: 2 frames cannot emit 4 labels
    assert reconstruction_scores(model, tokens, lengths, "src2tgt", [[too_long, short]]) == [[-math.inf, -math.inf]]
    assert pick([([7], -1.0), ([8], -0.5)], [-math.inf, -math.inf], 1.0) == [7]  # none readable: the beam's best
    assert pick([([7], -1.0), ([8], -2.0)], [-math.inf, -0.1], 1.0) == [8]
