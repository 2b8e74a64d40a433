"""reder.ct2: a teacher converted to CTranslate2 scores and decodes as ours, also through the ct2 decoders
(reder/decoding/ct2.py) and reder.api.Ct2Translator (skipped without CTranslate2)."""
import math
from pathlib import Path

import pytest
import sentencepiece
import torch

from reder import EOS_ID, TransformerConfig, autoregressive
from reder.autoregressive import Transformer, log_softmax_fp32
from reder.config import BOS_ID, PAD_ID
from reder.checkpoint import save_model_dir
from reder.ctc import pad_batch
from reder.objectives.directional import teacher_loss
from reder.api import Ct2Translator
from reder.decoding.ct2 import ct2_model
from reder.decoding.run import encode_lines, translate_ids

ctranslate2 = pytest.importorskip("ctranslate2", reason="CTranslate2 is an optional extra: pip install -e .[ct2]")
from reder import ct2  # noqa: E402  (after the skip: it needs ctranslate2 at call time only, but is tested with it)

BIBLE = Path(__file__).resolve().parents[1] / "data" / "bible_en_es"
VOCAB = 160


@pytest.fixture(scope="module")
def converted(tmp_path_factory) -> tuple[Transformer, list[list[int]], object, object]:
    """A teacher trained briefly on the Bible sample (so that it ends sentences at varied lengths), its model
    directory converted, a translator, and 60 source id sequences."""
    from pipeline.stages.spm import train as train_spm

    root = tmp_path_factory.mktemp("ct2")
    english = (BIBLE / "train.en").read_text(encoding="utf-8").splitlines()
    spanish = (BIBLE / "train.es").read_text(encoding="utf-8").splitlines()
    (root / "spm.model").write_bytes(train_spm(english + spanish, VOCAB))
    processor = sentencepiece.SentencePieceProcessor(model_file=str(root / "spm.model"))
    src = encode_lines(processor, english)
    tgt = encode_lines(processor, spanish)
    pairs = [(s, t) for s, t in zip(src, tgt) if len(s) <= 48 and len(t) <= 48]
    torch.manual_seed(0)
    model = Transformer(TransformerConfig(vocab_size=VOCAB, d_model=32, n_heads=2, ffn_dim=64, encoder_layers=2,
                                          decoder_layers=2, dropout=0.0, attention_dropout=0.0, max_positions=128))
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    for step in range(120):
        batch = pairs[(step * 32) % len(pairs) :][:32]
        loss = teacher_loss(model, *pad_batch([s for s, _ in batch]), *pad_batch([t for _, t in batch]))["total"]
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    teacher_dir = save_model_dir(root / "teacher", model, root / "spm.model", "en", "es", {"direction": "src2tgt"})
    ct2_dir = ct2.convert(teacher_dir, root / "ct2")
    return model, [s for s, _ in pairs[:60]], ct2.load_translator(ct2_dir), ct2_dir


def test_the_converted_model_gives_our_log_probabilities(converted):
    model, sources, translator, ct2_dir = converted
    pieces = ct2._pieces_of(ct2_dir)
    targets = translate_ids(model, sources[:8], "src2tgt", "greedy")
    for source, target in zip(sources[:8], targets):
        src, src_lengths = pad_batch([source])
        tgt, _ = pad_batch([target + [EOS_ID]])
        ours = model.target_log_probs(*model.encode(src, src_lengths), tgt).gather(-1, tgt[..., None]).flatten()
        theirs = translator.score_batch([[pieces[t] for t in source]], [[pieces[t] for t in target]])[0].log_probs
        torch.testing.assert_close(torch.tensor(theirs), ours, atol=1e-4, rtol=1e-4)


def _score(model: Transformer, source: list[int], hypothesis: list[int]) -> float:
    """Our model's sum of log-probs of hypothesis + EOS over its length (length_penalty 1)."""
    tgt, tgt_lengths = pad_batch([hypothesis + [EOS_ID]])
    return model.score(*pad_batch([source]), tgt, tgt_lengths).item()


@pytest.mark.parametrize("max_len_a, max_len_b", [(1.2, 10), (0.0, 4)])  # the second cuts most outputs at the limit
def test_greedy_outputs_equal_ours(converted, max_len_a, max_len_b):
    model, sources, translator, ct2_dir = converted
    search = dict(max_len_a=max_len_a, max_len_b=max_len_b)
    theirs = ct2.translate_ids(translator, ct2_dir, sources, beam_size=1, **search)
    assert theirs == translate_ids(model, sources, "src2tgt", "greedy", **search)
    # the ct2 family's greedy (mirror, its default) is that search; mirror=False is CTranslate2 as one runs it
    converted_model = ct2_model(ct2_dir)
    assert translate_ids(converted_model, sources, "src2tgt", "greedy", batch_size=16, **search) == theirs
    plain = ct2.translate_plain(translator, ct2_dir, sources, 1, **search)
    assert translate_ids(converted_model, sources, "src2tgt", "greedy", mirror=False, **search) == plain


def _banned_before_the_softmax(logits: torch.Tensor) -> torch.Tensor:
    """CTranslate2's `suppress_sequences`: pad, BOS and the blank taken out of the logits before the softmax,
    which renormalises the other tokens (ours bans them after it, as fairseq)."""
    banned = torch.tensor([PAD_ID, BOS_ID, logits.shape[-1] - 1], device=logits.device)
    return log_softmax_fp32(logits.index_fill(-1, banned, -math.inf))


@pytest.mark.parametrize("max_len_a, max_len_b", [(1.2, 10), (0.0, 4)])
def test_beam_outputs_equal_ours_or_stopped_earlier(converted, max_len_a, max_len_b, monkeypatch):
    """Beam 4. The two searches score differently by the banned tokens' mass: CTranslate2 renormalises over the
    allowed tokens (reder.ct2's module doc). Run ours CTranslate2's way, the outputs are identical or differ by
    the stopping rule alone (CTranslate2 stopped earlier; ours then scores higher). Run as it is, few differ."""
    model, sources, translator, ct2_dir = converted
    search = dict(beam_size=4, max_len_a=max_len_a, max_len_b=max_len_b)
    theirs = ct2.translate_ids(translator, ct2_dir, sources, **search)
    assert translate_ids(ct2_model(ct2_dir), sources, "src2tgt", "beam", **search) == theirs  # the ct2 family's beam
    as_is = translate_ids(model, sources, "src2tgt", "beam", **search)
    assert sum(a != b for a, b in zip(as_is, theirs)) <= len(sources) // 4  # 10-14 of 60 by the training threads; 8 of 250 trained longer
    monkeypatch.setattr(autoregressive, "log_softmax_fp32", _banned_before_the_softmax)  # ours and _score
    ours = translate_ids(model, sources, "src2tgt", "beam", **search)
    differing = [i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b]
    for i in differing:
        assert _score(model, sources[i], ours[i]) > _score(model, sources[i], theirs[i]) - 1e-5, i


def test_a_vocabulary_that_does_not_fit_is_refused(converted, tmp_path):
    model, _, _, ct2_dir = converted
    with pytest.raises(ValueError, match="distinct pieces"):
        ct2.convert_model(Transformer(TransformerConfig(vocab_size=VOCAB + 1, d_model=8, n_heads=2, ffn_dim=8,
                                                        encoder_layers=1, decoder_layers=1)),
                          ct2_dir.parent / "spm.model", tmp_path / "out")


def test_a_reder_model_directory_is_refused(tiny_model_dir, tmp_path):
    with pytest.raises(ValueError, match="only teachers convert"):
        ct2.convert(tiny_model_dir, tmp_path / "out")


def test_the_text_translator_serves_its_own_direction_through_translate_plain(converted):
    """reder.api.Ct2Translator (the Serve endpoint's engine=ct2): text in, detokenized text out, what
    translate_plain gives for the same ids, its decoders named as everywhere else (greedy with a beam > 1 or
    beam: the beam search); the reverse pair is refused as reder.api refuses it."""
    _, sources, translator, ct2_dir = converted
    served = Ct2Translator(ct2_dir.parent / "teacher")
    lines = [served.sp.decode(source[:-1]) for source in sources[:6]]
    ids = [served.sp.encode(line) + [EOS_ID] for line in lines]
    expected = [served.sp.decode(h) for h in ct2.translate_plain(translator, ct2_dir, ids, 4)]
    assert served.translate(lines, "en", "es", beam=4) == expected and any(expected)
    assert served.translate(lines, "en", "es", beam=4, decoder="beam") == expected
    assert served.translate(lines[0], "en", "es", beam=4) == expected[0]
    greedy = [served.sp.decode(h) for h in ct2.translate_plain(translator, ct2_dir, ids, 1)]
    assert served.translate(lines, "en", "es", beam=1) == greedy
    with pytest.raises(ValueError, match="not es->en"):
        served.translate("hola", "es", "en")
    with pytest.raises(ValueError, match="^decoder 'viterbi': a (CTranslate2 teacher|Ct2Model) decodes with greedy, beam$"):
        served.translate("hola", "en", "es", beam=1, decoder="viterbi")
