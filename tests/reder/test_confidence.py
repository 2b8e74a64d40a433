"""Round-trip confidence (reder/confidence.py) against brute force: the forward and round-trip likelihoods of a
CTC model summed over every frame path that collapses to the string, of a DAG model over every vertex path; the
reasons where a value cannot be had; a model that is not duplex; the CLI's and the API's scores."""
import itertools
import json
import math

import pytest
import torch

from reder import TransformerConfig
from reder.autoregressive import Transformer
from reder.confidence import NOT_DUPLEX, confidences
from reder.config import BOS_ID, EOS_ID, REVERSE
from reder.ctc import pad_batch
from reder.decoding import run
from tests.reder.helpers import decoding_model
from tests.reder.test_translate import _run

SOURCE, HYPOTHESIS = [5, 6, EOS_ID], [7]  # x (with the EOS the model reads) and ŷ (no specials)


def _ctc_brute_force(log_probs: torch.Tensor, target: list[int], blank: int) -> float:
    """log Σ over every frame path (over the blank and the target's own tokens: no other token can collapse to
    it) whose repeats merged and blanks dropped give `target`."""
    frames, alphabet, paths = log_probs.shape[0], sorted({blank, *target}), []
    for path in itertools.product(alphabet, repeat=frames):
        merged = [token for i, token in enumerate(path) if i == 0 or token != path[i - 1]]
        if [token for token in merged if token != blank] == target:
            paths.append(sum(log_probs[t, token] for t, token in enumerate(path)))
    return torch.logsumexp(torch.stack(paths), 0).item() if paths else -math.inf


def _dag_brute_force(log_edges: torch.Tensor, log_probs: torch.Tensor, vertices: int, string: list[int]) -> float:
    """log Σ over every vertex path 0 = a_1 < … < a_M = L − 1 of its links and its emissions of `string`."""
    scores = [sum(log_edges[a, b] for a, b in zip(path, path[1:])) + sum(log_probs[v, t] for v, t in zip(path, string))
              for middle in itertools.combinations(range(1, vertices - 1), len(string) - 2)
              for path in [(0, *middle, vertices - 1)]]
    return torch.logsumexp(torch.stack(scores), 0).item()


def _expected(model, reading: list[int], written: list[int], direction: str) -> float:
    """Brute-force log P(written + EOS | reading) / (|written| + 1)."""
    tokens, lengths = pad_batch([reading], "cpu")
    with torch.no_grad():
        output = model.outputs(tokens, lengths, direction)
    length = int(output.lengths[0])
    if model.cfg.head == "dag":
        total = _dag_brute_force(output.extra["log_edges"][0].double(), output.log_probs[0].double(), length,
                                 [BOS_ID, *written, EOS_ID])
    else:
        total = _ctc_brute_force(output.log_probs[0, :length].double(), [*written, EOS_ID], model.cfg.blank_id)
    return total / (len(written) + 1)


@pytest.mark.parametrize("head", ["ctc", "dag"])
@pytest.mark.parametrize("direction", ["src2tgt", "tgt2src"])
def test_forward_and_round_trip_equal_brute_force_over_every_path(head, direction):
    torch.manual_seed(3)
    model = decoding_model(head)
    [judged] = confidences(model, [SOURCE], [HYPOTHESIS], direction)
    forward = _expected(model, SOURCE, HYPOTHESIS, direction)
    round_trip = _expected(model, [*HYPOTHESIS, EOS_ID], SOURCE[:-1], REVERSE[direction])
    assert judged.forward == pytest.approx(forward, abs=1e-4) and judged.round_trip == pytest.approx(round_trip, abs=1e-4)
    assert judged.score == pytest.approx((forward + round_trip) / 2, abs=1e-4) and judged.reason is None
    assert forward < 0 and round_trip < 0 and forward != pytest.approx(round_trip)  # two readings, not one twice


def test_a_batch_gives_each_sentence_what_it_gets_alone_and_the_reasons_where_there_is_no_value():
    torch.manual_seed(4)
    model = decoding_model("ctc")
    limit = model.max_input_length()
    sources = [SOURCE, [5, 6, 7, 8, 9, 10, EOS_ID], [4, EOS_ID], [8, 9, EOS_ID]]
    hypotheses = [HYPOTHESIS, [], [9, 9, 9], [5] * limit]  # the 2nd cannot be read back, the 4th is too long
    judged = confidences(model, sources, hypotheses, "src2tgt", batch_size=2)
    alone = confidences(model, sources[:1], hypotheses[:1], "src2tgt")[0]
    for field in ("score", "forward", "round_trip"):  # padded beside longer sentences, the same values
        assert getattr(judged[0], field) == pytest.approx(getattr(alone, field), abs=1e-5), field
    # ŷ = [] read back: [EOS] upsampled to 2 frames cannot emit the 6 pieces of x and its EOS
    assert judged[1].forward is not None and judged[1].round_trip is None and judged[1].score is None
    assert judged[1].reason == "round trip: 7 tokens (with EOS) cannot be emitted from the 2 frames of 1 pieces read"
    # [9, 9, 9] + EOS needs 7 frames (a blank between repeats); [4, EOS] gives 4: no forward value, a round trip
    assert judged[2].forward is None and judged[2].round_trip is not None
    assert judged[2].reason.startswith("forward: 4 tokens (with EOS) cannot be emitted from the 4 frames")
    assert judged[3].round_trip is None and judged[3].reason.endswith(
        f"round trip: {limit + 1} pieces (with EOS) to read, more than the model reads ({limit})")
    for entry in judged:
        assert entry.reason is not None or None not in (entry.score, entry.forward, entry.round_trip)


def test_a_model_that_is_not_duplex_scores_null_with_the_reason():
    teacher = Transformer(TransformerConfig(vocab_size=20, d_model=16, n_heads=2, ffn_dim=24, encoder_layers=1,
                                            decoder_layers=1)).eval()
    assert [c.as_dict() for c in confidences(teacher, [SOURCE], [HYPOTHESIS], "src2tgt")] == \
        [{"score": None, "forward": None, "round_trip": None, "reason": NOT_DUPLEX}]


def test_the_cli_and_the_api_give_the_same_scores_and_plain_decoding_computes_none(tiny_model_dir, monkeypatch, capsys):
    import reder

    text = b"the cat sat on the mat\na dog ran\n\n"
    code, out, err = _run(monkeypatch, capsys, ["--checkpoint", str(tiny_model_dir), "--src", "en", "--tgt", "de",
                                                "--scores"], text)
    assert code == 0, err
    lines = [json.loads(line) for line in out.splitlines()]
    assert len(lines) == 3 and all(set(line) == {"translation", "score", "forward", "round_trip", "reason"} for line in lines)
    translator = reder.load(tiny_model_dir)
    api = translator.translate(["the cat sat on the mat", "a dog ran", ""], "en", "de", scores=True)
    assert api == lines
    code, plain, _ = _run(monkeypatch, capsys, ["--checkpoint", str(tiny_model_dir), "--src", "en", "--tgt", "de"], text)
    assert code == 0 and plain.splitlines() == [line["translation"] for line in lines]
    monkeypatch.setattr(run, "confidences", lambda *args, **kwargs: pytest.fail("scored without being asked"))
    assert translator.translate("the cat sat on the mat", "en", "de") == lines[0]["translation"]


def test_flag_marks_the_lowest_share_by_score_and_names_their_lines(tiny_model_dir, monkeypatch, capsys):
    text = b"the cat sat on the mat\na dog ran\nthe bird\ndogs and cats are friends\n"
    args = ["--checkpoint", str(tiny_model_dir), "--src", "en", "--tgt", "de"]
    code, out, _ = _run(monkeypatch, capsys, [*args, "--scores"], text)
    scores = [json.loads(line)["score"] for line in out.splitlines()]
    code, out, err = _run(monkeypatch, capsys, [*args, "--flag", "50"], text)  # --flag implies --scores
    lines = [json.loads(line) for line in out.splitlines()]
    assert code == 0 and [line["score"] for line in lines] == scores
    ranked = sorted(range(4), key=lambda i: -math.inf if scores[i] is None else scores[i])  # None: no score, first
    lowest_two = sorted(ranked[:2])
    assert [index for index, line in enumerate(lines) if line["flagged"]] == lowest_two
    assert f"flagged 2 of 4 lines, the lowest 50 % by score: {lowest_two[0] + 1}, {lowest_two[1] + 1}" in err
    code, _, err = _run(monkeypatch, capsys, [*args, "--flag", "0"], text)
    assert code == 2 and err.strip() == "error: --flag needs a share in percent between 0 and 100, got 0"

