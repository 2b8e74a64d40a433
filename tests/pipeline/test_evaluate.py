"""The evaluate stage decodes a DAG model with its own decoders (greedy, lookahead, Viterbi), a CTC model
with greedy, beam and teacher-reranked beam, and the AR teachers as the baseline with REDER's speed-ups."""
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

import pytest
import torch
import sentencepiece

from pipeline.config import load_config
from pipeline.metrics import corpus_scores, spearman
from pipeline.stage import write_json
from pipeline.stages import evaluate, spm, teacher
from reder import REDER, ModelConfig, TransformerConfig
from reder.autoregressive import Transformer
from reder.checkpoint import load_teacher_dir, save_model_dir
from reder.confidence import confidences
from reder.decoding.run import encode_lines, translate_ids
from tests.pipeline.conftest import DecoderClock, make_pairs

VOCAB = 64


def _corpus(tmp_path):
    pairs = make_pairs(12)
    (tmp_path / "spm.model").write_bytes(spm.train([s for pair in pairs for s in pair] * 5, VOCAB))
    corpus = tmp_path / "corpus"
    for split, rows in (("test", pairs), ("valid", make_pairs(8, seed=1))):  # valid: what beam penalties are tuned on
        (corpus / split).mkdir(parents=True)
        pq.write_table(pa.table({"id": list(range(len(rows))), "src": [s for s, _ in rows], "tgt": [t for _, t in rows]}),
                       corpus / split / "part-00000.parquet")
    return pairs, corpus


def _teacher_stage(tmp_path):
    """A teacher stage's output: teachers.json naming two tiny random teachers (one per direction)."""
    stage = tmp_path / "teacher-stage"
    for direction in ("src2tgt", "tgt2src"):
        model = Transformer(TransformerConfig(vocab_size=VOCAB, d_model=8, n_heads=2, ffn_dim=16, encoder_layers=1,
                                              decoder_layers=1, max_positions=128)).eval()
        save_model_dir(stage / direction, model, tmp_path / "spm.model", "en", "de", extra={"direction": direction})
    write_json(stage / teacher.TEACHERS_FILE, {"src2tgt": "src2tgt", "tgt2src": "tgt2src"})
    return stage


# (seconds per sentence at batch 1, seconds of a call at a larger batch) of each decoder, for the fake clock
COSTS = {"greedy": (0.002, 0.03), "lookahead": (0.004, 0.04), "viterbi": (0.005, 0.06), "beam5": (0.008, 0.12),
         "path_beam5": (0.006, 0.08),
         "beam3": (0.004, 0.04), "beam3_rerank": (0.008, 0.12), "teacher_greedy": (0.01, 0.1), "teacher_beam2": (0.04, 0.24)}


@pytest.mark.parametrize("head", ["dag", "ctc"])
def test_models_are_scored_and_timed_with_their_decoders_against_the_teacher_baseline(tmp_path, head, monkeypatch):
    pairs, corpus = _corpus(tmp_path)
    options = ["model.head=dag", "model.graph_upsample_ratio=2"] if head == "dag" else \
        ["evaluate.beam_size=3", "evaluate.rerank=teacher"]
    cfg = load_config(None, [f"model.vocab_size={VOCAB}", "evaluate.splits=[test]", "evaluate.latency_sentences=2",
                             "evaluate.throughput_batch=4", "evaluate.teacher_beam_size=2", *options])
    model = REDER(ModelConfig(vocab_size=VOCAB, d_model=8, n_heads=2, ffn_dim=16, layers_per_end=1, head=head,
                              graph_upsample_ratio=2.0, link_heads=2, max_positions=128)).eval()
    model_dir = save_model_dir(tmp_path / "model", model, tmp_path / "spm.model", "en", "de")
    out = tmp_path / "out"
    out.mkdir()
    ours = ("greedy", "lookahead", "viterbi", "beam5", "path_beam5") if head == "dag" else ("greedy", "beam3", "beam3_rerank")
    decoders = (*ours, "teacher_greedy", "teacher_beam2")
    clock = DecoderClock({name: COSTS[name] for name in decoders}).install(monkeypatch)
    headline = evaluate.evaluate_model(model_dir, corpus, cfg, out, None, str(_teacher_stage(tmp_path)))
    results = json.loads((out / evaluate.RESULTS_FILE).read_text())
    assert set(results["scores"]) == {f"test.{d}.{decoder}" for d in ("src2tgt", "tgt2src") for decoder in decoders}
    assert results["device"] == f"cpu ({torch.get_num_threads()} threads)"
    speed = results["speed"]  # timed by the fake clock: every latency, throughput and speed-up is known
    expected = clock.expected_speed(len(pairs), 4)
    assert {name: speed[name] for name in expected} == expected
    assert len(expected) == 3 * len(decoders) + 2 * 2 * len(ours)
    assert speed["speedup_greedy_vs_teacher_beam2_batch1"] == 20.0 and speed["speedup_greedy_vs_teacher_beam2_batch4"] == 8.0
    assert results["scores"]["test.src2tgt.teacher_beam2"]["seconds"] == 0.24  # one call at batch 64
    for decoder in decoders:
        assert len((out / f"test.src2tgt.{decoder}.txt").read_text(encoding="utf-8").splitlines()) == len(pairs)
    assert headline["test_bleu_src2tgt"] == results["scores"]["test.src2tgt.greedy"]["bleu"]
    if head == "ctc":  # the reranked hypotheses are the teacher's pick among the beam's candidates
        sp = sentencepiece.SentencePieceProcessor(model_file=str(tmp_path / "spm.model"))
        tgt2src = load_teacher_dir(tmp_path / "teacher-stage" / "tgt2src", "tgt2src", VOCAB)
        expected = translate_ids(model, encode_lines(sp, [t for _, t in pairs]), "tgt2src", "beam", 64, beam_size=3,
                                 rerank="teacher", teacher=tgt2src)
        assert (out / "test.tgt2src.beam3_rerank.txt").read_text(encoding="utf-8").splitlines() == \
            [sp.decode(h) for h in expected]


def test_a_requested_teacher_baseline_without_teachers_is_an_error(tmp_path):
    _, corpus = _corpus(tmp_path)
    cfg = load_config(None, [f"model.vocab_size={VOCAB}", "evaluate.splits=[test]"])
    model_dir = save_model_dir(tmp_path / "model", REDER(ModelConfig(vocab_size=VOCAB, d_model=8, n_heads=2, ffn_dim=16,
                                                                     layers_per_end=1)).eval(),
                               tmp_path / "spm.model", "en", "de")
    with pytest.raises(ValueError, match="teacher_baseline"):
        evaluate.evaluate_model(model_dir, corpus, cfg, tmp_path, None)


def test_self_reranking_is_its_own_decoder_with_the_configured_weight_and_cutoffs():
    cfg = load_config(None, [f"model.vocab_size={VOCAB}", "evaluate.beam_size=3", "evaluate.rerank=self",
                             "evaluate.rerank_weight=2.5", "evaluate.cutoff_top_n=6", "evaluate.teacher_baseline=false"])
    model = REDER(ModelConfig(vocab_size=VOCAB, d_model=8, n_heads=2, ffn_dim=16, layers_per_end=1)).eval()
    decoders = evaluate.decoders_for(model, cfg.evaluate, {})
    assert list(decoders) == ["greedy", "beam3", "beam3_selfrerank"]
    encoded = [[5, 6, 7, 3], [8, 3], [9, 10, 11, 12, 3]]
    assert decoders["beam3_selfrerank"](encoded, "src2tgt", 2) == translate_ids(
        model, encoded, "src2tgt", "beam", 2, beam_size=3, rerank="self", rerank_weight=2.5, cutoff_top_n=6)
    assert decoders["beam3"](encoded, "src2tgt", 2) == translate_ids(model, encoded, "src2tgt", "beam", 2, beam_size=3,
                                                                     cutoff_top_n=6)


def test_a_model_directorys_blank_penalty_decodes_every_decoder_and_greedy_unpenalised_is_kept_beside(tmp_path):
    """The evaluation decodes greedily with the penalty the train stage tuned into config.json, records it
    in results.json, and scores the greedy decoder without it as `greedy_unpenalised`. Each beam
    decoder gets a penalty of its own, per direction: the grid point whose output scores best on the validation
    split (brute force here: translate_ids under each point, sacreBLEU), recorded with every point's BLEU (a
    discriminating case: the next test)."""
    pairs, corpus = _corpus(tmp_path)
    grid = (0.0, -3.0, 2.0, 4.0)
    cfg = load_config(None, [f"model.vocab_size={VOCAB}", "evaluate.splits=[test]", "evaluate.beam_size=3",
                             "evaluate.measure_speed=false", "evaluate.teacher_baseline=false",
                             f"evaluate.blank_penalties=[{', '.join(map(str, grid))}]", "train.valid_max_sentences=6"])
    model = REDER(ModelConfig(vocab_size=VOCAB, d_model=8, n_heads=2, ffn_dim=16, layers_per_end=1, max_positions=128)).eval()
    model.blank_penalty = {"src2tgt": -3.0, "tgt2src": 2.0}
    model_dir = save_model_dir(tmp_path / "model", model, tmp_path / "spm.model", "en", "de")
    sp = sentencepiece.SentencePieceProcessor(model_file=str(tmp_path / "spm.model"))
    out = tmp_path / "out"
    out.mkdir()
    evaluate.evaluate_model(model_dir, corpus, cfg, out, None)
    results = json.loads((out / evaluate.RESULTS_FILE).read_text())
    assert results["blank_penalty"] == {"src2tgt": -3.0, "tgt2src": 2.0}
    encoded = encode_lines(sp, [s for s, _ in pairs])
    written = {decoder: (out / f"test.src2tgt.{decoder}.txt").read_text(encoding="utf-8").splitlines()
               for decoder in ("greedy", "beam3", "greedy_unpenalised")}
    valid = evaluate.read_text_split(corpus, "valid", 6)
    sides = {"src2tgt": valid, "tgt2src": valid[::-1]}
    brute = {d: {p: corpus_scores([sp.decode(h) for h in translate_ids(model, encode_lines(sp, inputs), d, "beam",
                                                                      beam_size=3, blank_penalty=p)], references)["bleu"]
                 for p in grid} for d, (inputs, references) in sides.items()}
    chosen = {d: max(grid, key=lambda p: (bleu[p], -abs(p), -p)) for d, bleu in brute.items()}
    assert results["beam_blank_penalty"] == {"beam3": chosen}
    assert results["beam_blank_penalty_valid"] == {"beam3": {d: {f"{p:g}": round(b, 2) for p, b in bleu.items()}
                                                             for d, bleu in brute.items()}}
    for decoder, name, options in (("greedy", "greedy", {"blank_penalty": -3.0}),
                                   ("beam3", "beam", {"beam_size": 3, "blank_penalty": chosen["src2tgt"]}),
                                   ("greedy_unpenalised", "greedy", {"blank_penalty": 0.0})):
        assert written[decoder] == [sp.decode(h) for h in translate_ids(model, encoded, "src2tgt", name, **options)]
    assert written["greedy"] != written["greedy_unpenalised"]
    # the grid [0]: nothing tuned, the beam decodes under the model's own penalty as before
    cfg = load_config(None, [f"model.vocab_size={VOCAB}", "evaluate.splits=[test]", "evaluate.beam_size=3",
                             "evaluate.measure_speed=false", "evaluate.teacher_baseline=false",
                             "evaluate.blank_penalties=[0]"])
    (tmp_path / "plain").mkdir()
    evaluate.evaluate_model(model_dir, corpus, cfg, tmp_path / "plain", None)
    assert json.loads((tmp_path / "plain" / evaluate.RESULTS_FILE).read_text())["beam_blank_penalty"] == {}
    assert (tmp_path / "plain" / "test.src2tgt.beam3.txt").read_text(encoding="utf-8").splitlines() == \
        [sp.decode(h) for h in translate_ids(model, encoded, "src2tgt", "beam", beam_size=3, blank_penalty=-3.0)]


def test_each_beam_decoder_gets_the_blank_penalty_whose_output_scores_best_on_validation(tiny_model_dir, tmp_path):
    """Validation references that are the model's own src2tgt beam output under penalty 3 — the grid
    point the plain beam must pick, though the model's greedy penalty is 0; the self-reranked beam gets its own
    best, both as brute force over the grid finds them (each point decoded by translate_ids, scored by sacreBLEU)."""
    from reder.checkpoint import load_model_dir

    model, _ = load_model_dir(tiny_model_dir)
    sp = sentencepiece.SentencePieceProcessor(model_file=str(tiny_model_dir / "spm.model"))
    src = ["the cat sat on the mat", "a dog ran in the park", "the bird sang a song", "dogs and cats are friends",
           "the dog sat", "a cat sang"]
    grid = (0.0, -4.0, 3.0)
    made = [sp.decode(h) for h in translate_ids(model, encode_lines(sp, src), "src2tgt", "beam", beam_size=3,
                                                blank_penalty=3.0)]
    corpus = tmp_path / "corpus"
    for split in ("valid", "test"):
        (corpus / split).mkdir(parents=True)
        pq.write_table(pa.table({"id": list(range(len(src))), "src": src, "tgt": made}), corpus / split / "part-0.parquet")
    cfg = load_config(None, ["evaluate.splits=[test]", "evaluate.beam_size=3",
                             "evaluate.rerank=self", "evaluate.rerank_weight=0.5", "evaluate.measure_speed=false",
                             "evaluate.teacher_baseline=false", f"evaluate.blank_penalties=[{', '.join(map(str, grid))}]",
                             "train.valid_max_sentences=0"])
    evaluate.evaluate_model(tiny_model_dir, corpus, cfg, tmp_path, None)
    results = json.loads((tmp_path / evaluate.RESULTS_FILE).read_text())
    sides = {"src2tgt": (src, made), "tgt2src": (made, src)}
    for decoder, rerank in (("beam3", {}), ("beam3_selfrerank", {"rerank": "self", "rerank_weight": 0.5})):
        brute = {d: {p: corpus_scores([sp.decode(h) for h in translate_ids(
                    model, encode_lines(sp, inputs), d, "beam", beam_size=3, blank_penalty=p, **rerank)],
                    references)["bleu"] for p in grid}
                 for d, (inputs, references) in sides.items()}
        chosen = {d: max(grid, key=lambda p: (bleu[p], -abs(p), -p)) for d, bleu in brute.items()}
        assert results["beam_blank_penalty"][decoder] == chosen, (decoder, brute)
        assert (tmp_path / f"test.src2tgt.{decoder}.txt").read_text(encoding="utf-8").splitlines() == [
            sp.decode(h) for h in translate_ids(model, encode_lines(sp, src), "src2tgt", "beam", beam_size=3,
                                                blank_penalty=chosen["src2tgt"], **rerank)]
    assert results["beam_blank_penalty"]["beam3"]["src2tgt"] == 3.0 != model.blank_penalty["src2tgt"]
    assert len(set(results["beam_blank_penalty_valid"]["beam3"]["src2tgt"].values())) > 1  # the pick can be wrong


def test_a_greedy_output_longer_than_the_model_reads_back_is_cut_for_the_round_trip_and_counted(tmp_path, monkeypatch):
    """`model.upsample_ratio=3` trained, then evaluate used to die in the round trip: a degenerate greedy output
    (r·|x| frames) fed back in was over the model's input limit (max_positions / r). It is cut to the limit, the
    round trip is scored over every sentence, and results.json counts the cut ones."""
    pairs, corpus = _corpus(tmp_path)
    sp = sentencepiece.SentencePieceProcessor(model_file=str(tmp_path / "spm.model"))
    longest = max(len(ids) for pair in pairs for ids in encode_lines(sp, pair))  # pieces with EOS
    cfg = load_config(None, [f"model.vocab_size={VOCAB}", "evaluate.splits=[test]", "evaluate.measure_speed=false",
                             "evaluate.teacher_baseline=false"])
    model = REDER(ModelConfig(vocab_size=VOCAB, d_model=8, n_heads=2, ffn_dim=16, layers_per_end=1, upsample_ratio=3,
                              max_positions=3 * longest)).eval()
    model_dir = save_model_dir(tmp_path / "model", model, tmp_path / "spm.model", "en", "de")
    # The degenerate greedy output: every input's pieces three times over (r·|x|, as a CTC model can write).
    monkeypatch.setattr(evaluate, "decoders_for", lambda *args: {"greedy": lambda encoded, d, bs: [s[:-1] * 3 for s in encoded]})
    out = tmp_path / "out"
    out.mkdir()
    evaluate.evaluate_model(model_dir, corpus, cfg, out, None)
    results = json.loads((out / evaluate.RESULTS_FILE).read_text())
    sides = {"src": [s for s, _ in pairs], "tgt": [t for _, t in pairs]}
    assert results["roundtrip_cut"] == {f"test.{side}": sum(3 * (len(ids) - 1) >= longest for ids in encode_lines(sp, text))
                                        for side, text in sides.items()}
    assert min(results["roundtrip_cut"].values()) > 0
    for side in ("src", "tgt"):
        assert len((out / f"test.roundtrip_{side}.greedy.txt").read_text(encoding="utf-8").splitlines()) == len(pairs)
    assert evaluate.cut_to([[5] * 4, [5] * 2], 3) == ([[5, 5, 3], [5, 5, 3]], 1)  # EOS is 3
    # A test sentence longer than the decoders read is cut for every decoder alike, and counted.
    half = REDER(ModelConfig(vocab_size=VOCAB, d_model=8, n_heads=2, ffn_dim=16, layers_per_end=1, upsample_ratio=3,
                             max_positions=3 * (longest // 2))).eval()
    (out / "again").mkdir()
    evaluate.evaluate_model(save_model_dir(tmp_path / "half", half, tmp_path / "spm.model", "en", "de"), corpus, cfg,
                            out / "again", None)
    cut = json.loads((out / "again" / evaluate.RESULTS_FILE).read_text())["inputs_cut"]
    assert cut == {f"test.{d}": sum(len(ids) > longest // 2 for ids in encode_lines(sp, sides[side]))
                   for d, side in (("src2tgt", "src"), ("tgt2src", "tgt"))} and min(cut.values()) > 0


def _cmlm_stage(tmp_path):
    """A cmlm stage's output: cmlms.json naming two tiny random CMLMs (one per direction)."""
    from pipeline.stages import cmlm
    from reder import CMLM, CmlmConfig

    stage = tmp_path / "cmlm-stage"
    for direction in ("src2tgt", "tgt2src"):
        model = CMLM(CmlmConfig(vocab_size=VOCAB, d_model=8, n_heads=2, ffn_dim=16, encoder_layers=1, decoder_layers=1,
                                max_positions=128)).eval()
        save_model_dir(stage / direction, model, tmp_path / "spm.model", "en", "de", extra={"direction": direction})
    write_json(stage / cmlm.CMLMS_FILE, {"src2tgt": "src2tgt", "tgt2src": "tgt2src"})
    return stage


def test_cmlm_mask_predict_and_refined_greedy_are_decoders_of_their_own(tmp_path):
    """cmlm_T<T> per evaluate.cmlm_iterations (with cmlm_length_beam candidates) and greedy_refine<K> per
    evaluate.refine_steps, scored and timed beside REDER's own decoders and the teachers'."""
    from reder.checkpoint import load_cmlm_dir

    pairs, corpus = _corpus(tmp_path)
    cfg = load_config(None, [f"model.vocab_size={VOCAB}", "evaluate.splits=[test]", "evaluate.latency_sentences=2",
                             "evaluate.throughput_batch=4", "evaluate.teacher_beam_size=2", "evaluate.beam_size=1",
                             "evaluate.cmlm_iterations=[1,3]", "evaluate.cmlm_length_beam=2", "evaluate.refine_steps=[2]"])
    model = REDER(ModelConfig(vocab_size=VOCAB, d_model=8, n_heads=2, ffn_dim=16, layers_per_end=1, max_positions=128)).eval()
    model_dir = save_model_dir(tmp_path / "model", model, tmp_path / "spm.model", "en", "de")
    out = tmp_path / "out"
    out.mkdir()
    evaluate.evaluate_model(model_dir, corpus, cfg, out, None, _teacher_stage(tmp_path), _cmlm_stage(tmp_path))
    results = json.loads((out / evaluate.RESULTS_FILE).read_text())
    decoders = ("greedy", "greedy_refine2", "cmlm_T1", "cmlm_T3", "teacher_greedy", "teacher_beam2")
    assert set(results["scores"]) == {f"test.{d}.{decoder}" for d in ("src2tgt", "tgt2src") for decoder in decoders}
    assert "speedup_cmlm_T3_vs_teacher_beam2_batch1" in results["speed"]
    sp = sentencepiece.SentencePieceProcessor(model_file=str(tmp_path / "spm.model"))
    encoded = encode_lines(sp, [t for _, t in pairs])
    cmlm = load_cmlm_dir(tmp_path / "cmlm-stage" / "tgt2src", "tgt2src", VOCAB)
    read = lambda name: (out / f"test.tgt2src.{name}.txt").read_text(encoding="utf-8").splitlines()  # noqa: E731
    assert read("cmlm_T3") == [sp.decode(h) for h in translate_ids(cmlm, encoded, "tgt2src", "mask_predict", 64,
                                                                   length_beam=2, iterations=3)]
    assert read("greedy_refine2") == [sp.decode(h) for h in translate_ids(model, encoded, "tgt2src", "greedy", 64,
                                                                          refiner=cmlm, refine_steps=2)]
    with pytest.raises(ValueError, match="need both directions' CMLMs"):
        evaluate.decoders_for(model, cfg.evaluate, {"src2tgt": None, "tgt2src": None}, {"src2tgt": cmlm})


def test_cmlm_decoder_options_are_checked():
    from pipeline.config import ConfigError

    for bad in ("evaluate.refine_steps=[0]", "evaluate.cmlm_iterations=[2,2]", "evaluate.cmlm_length_beam=0",
                "evaluate.cmlm_iterations=[true]"):
        with pytest.raises(ConfigError, match=bad.split("=")[0]):
            load_config(None, [bad])
    assert load_config(None, ["model.vocab_size=300"]).cmlm.model.vocab_size == 300
    with pytest.raises(ConfigError, match="cmlm.model.vocab_size"):
        load_config(None, ["model.vocab_size=300", "cmlm.model.vocab_size=200"])


def test_named_test_sets_are_scored_both_ways_each_with_its_own_row_and_metrics(tmp_path):
    """`evaluate.test_sets` names pairs of local files; each listed in `splits` is decoded both ways with
    the same decoders and signatures as the ingested test split, gets its own row under results.json's `sets`
    (exact) and its own metrics (`<name>_bleu_src2tgt`, ...); a sacreBLEU set its cache lacks is a clear error."""
    import sacrebleu

    from pipeline.stage import StageError

    pairs, corpus = _corpus(tmp_path)
    other = list(reversed(pairs))[:7]  # another set: other lines, another length
    (tmp_path / "extra.en").write_text("".join(s + "\n" for s, _ in other), encoding="utf-8")
    (tmp_path / "extra.de").write_text("".join(t + "\n" for _, t in other), encoding="utf-8")
    cfg = load_config(None, [f"model.vocab_size={VOCAB}", "data.tgt_lang=de", "evaluate.splits=[test,extra]",
                             f"evaluate.test_sets={{extra: {{src: {tmp_path / 'extra.en'}, tgt: {tmp_path / 'extra.de'}}}}}",
                             "evaluate.measure_speed=false", "evaluate.teacher_baseline=false", "evaluate.beam_size=1"])
    model = REDER(ModelConfig(vocab_size=VOCAB, d_model=8, n_heads=2, ffn_dim=16, layers_per_end=1, max_positions=128)).eval()
    model_dir = save_model_dir(tmp_path / "model", model, tmp_path / "spm.model", "en", "de")
    out = tmp_path / "out"
    out.mkdir()
    metrics = evaluate.evaluate_model(model_dir, corpus, cfg, out, None)
    results = json.loads((out / evaluate.RESULTS_FILE).read_text())
    assert set(results["sets"]) == {"test", "extra"} and results["split"] == "test"
    assert (results["sets"]["test"]["sentences"], results["sets"]["extra"]["sentences"]) == (12, 7)
    hypotheses = (out / "extra.tgt2src.greedy.txt").read_text(encoding="utf-8").splitlines()
    sp = sentencepiece.SentencePieceProcessor(model_file=str(tmp_path / "spm.model"))
    assert hypotheses == [sp.decode(h) for h in translate_ids(model, encode_lines(sp, [t for _, t in other]), "tgt2src")]
    expected = sacrebleu.corpus_bleu(hypotheses, [[s for s, _ in other]]).score
    assert results["sets"]["extra"]["bleu_tgt2src"] == results["scores"]["extra.tgt2src.greedy"]["bleu"] == expected
    assert metrics["extra_bleu_tgt2src"] == expected and metrics["test_bleu_src2tgt"] == results["bleu_src2tgt"]
    assert set(metrics) == {f"{split}_{key}" for split in ("test", "extra") for key in evaluate.HEADLINE
                            if results["sets"][split][key] is not None}  # None: a ρ of constant chrF (below)
    assert (tmp_path / "out" / "extra.roundtrip_src.greedy.txt").is_file()
    # the translations table of each set: a row a pair, greedy both ways, sacreBLEU's sentence BLEU and chrF
    table = json.loads((out / evaluate.TRANSLATIONS_DIR / "extra.json").read_text(encoding="utf-8"))
    assert list(table) == ["source", "reference", "hypothesis_src2tgt", "bleu_src2tgt", "chrf_src2tgt",
                           "confidence_src2tgt", "hypothesis_tgt2src", "bleu_tgt2src", "chrf_tgt2src", "confidence_tgt2src"]
    assert table["source"] == [s for s, _ in other] and table["hypothesis_tgt2src"] == hypotheses
    assert table["bleu_tgt2src"][3] == round(sacrebleu.sentence_bleu(hypotheses[3], [other[3][0]]).score, 2)
    assert table["chrf_tgt2src"][3] == round(sacrebleu.sentence_chrf(hypotheses[3], [other[3][0]]).score, 2)
    # each greedy translation's round-trip confidence, and its rank correlation with sentence chrF as a headline
    encoded = encode_lines(sp, [s for s, _ in other])
    judged = confidences(model, encoded, translate_ids(model, encoded, "src2tgt"), "src2tgt")
    assert table["confidence_src2tgt"] == [None if c.score is None else round(c.score, 4) for c in judged]
    chrf = [sacrebleu.sentence_chrf(h, [r]).score for h, r in zip(table["hypothesis_src2tgt"], table["reference"])]
    rho = spearman(np.array([-np.inf if c.score is None else c.score for c in judged]), np.array(chrf))  # exact chrF
    assert results["sets"]["extra"]["confidence_spearman_src2tgt"] == round(rho, 4)
    assert metrics["extra_confidence_spearman_src2tgt"] == round(rho, 4) and -1 <= rho <= 1
    # this untrained model's tgt2src outputs all score chrF 0: no ranking to correlate with, None and no metric
    assert set(table["chrf_tgt2src"]) == {0.0} and results["sets"]["extra"]["confidence_spearman_tgt2src"] is None
    assert sorted(p.name for p in (out / evaluate.TRANSLATIONS_DIR).iterdir()) == ["extra.json", "test.json"]

    missing = load_config(None, ["evaluate.splits=[test,wmt]", "evaluate.test_sets={wmt: {sacrebleu: wmt17}}",
                                 "data.tgt_lang=de"])
    with pytest.raises(StageError, match=r"sacrebleu -t wmt17 -l en-de --echo src"):
        evaluate.read_split(corpus, "wmt", missing)
    with pytest.raises(StageError, match="no language pair en-xx"):
        evaluate.read_split(corpus, "wmt", load_config(None, ["evaluate.splits=[wmt]", "data.tgt_lang=xx",
                                                              "evaluate.test_sets={wmt: {sacrebleu: wmt17}}"]))


def test_test_sets_are_checked_and_their_files_resolved_against_the_config_file(tmp_path):
    from pipeline.config import ConfigError

    for bad, message in (("evaluate.splits=[test,extra]", "splits"),
                         ("evaluate.test_sets={test: {src: a, tgt: b}}", "test_sets.test"),
                         ("evaluate.test_sets={x: {src: a}}", "test_sets.x"),
                         ("evaluate.test_sets={x: {sacrebleu: wmt17, tgt: b}}", "test_sets.x")):
        with pytest.raises(ConfigError, match=message):
            load_config(None, [bad])
    (tmp_path / "run.yaml").write_text("evaluate:\n  splits: [test, t17]\n  test_sets:\n    t17: {src: d/a.en, tgt: /abs/b.de}\n")
    cfg = load_config(tmp_path / "run.yaml")
    assert cfg.evaluate.test_sets == {"t17": {"src": str(tmp_path / "d" / "a.en"), "tgt": "/abs/b.de"}}
