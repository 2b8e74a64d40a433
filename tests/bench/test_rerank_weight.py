"""bench.rerank_weight on a run directory with a tiny model: per w, the BLEU of exactly what evaluate's
self-reranking decodes with that weight."""
from __future__ import annotations

import json
import shutil

import sentencepiece
import torch

from bench import beam_tuning, rerank_weight
from pipeline.config import load_config
from pipeline.metrics import corpus_scores
from reder import REDER, ModelConfig
from reder.checkpoint import save_model_dir
from reder.decoding.run import encode_lines, translate_ids
from tests.pipeline.test_evaluate import VOCAB, _corpus


def _workdir(tmp_path) -> tuple[list, REDER]:
    """A workdir as a finished run leaves it (last_run.json, ingest's splits, the train stage's model directory) with
    a tiny untrained REDER; the evaluate tests' test pairs as its validation split. Returns the pairs and the model."""
    pairs, corpus = _corpus(tmp_path)
    shutil.rmtree(corpus / "valid")
    (corpus / "test").rename(corpus / "valid")  # the benches score `pairs` as the validation split
    torch.manual_seed(2)
    model = REDER(ModelConfig(vocab_size=VOCAB, d_model=8, n_heads=2, ffn_dim=16, layers_per_end=1)).eval()
    train_dir = tmp_path / "train"
    save_model_dir(train_dir / "model", model, tmp_path / "spm.model", "en", "de")
    cfg = load_config(None, [f"model.vocab_size={VOCAB}"])
    (tmp_path / "last_run.json").write_text(json.dumps(
        {"config": cfg.to_dict(), "stages": {"ingest": {"output": str(corpus)}, "train": {"output": str(train_dir)}}}))
    return pairs, model


def test_the_beam_tuning_bench_times_both_ways_and_finds_their_outputs_equal(tmp_path, capsys):
    pairs, _ = _workdir(tmp_path)
    report = beam_tuning.main(["--workdir", str(tmp_path), "--beam", "4", "--penalties", "0", "2", "--batch", "5",
                               "--out", str(tmp_path / "tuning.json")])
    assert json.loads((tmp_path / "tuning.json").read_text()) == report
    assert [(r["direction"], r["sentences"], r["points"]) for r in report["rows"]] == \
        [("src2tgt", len(pairs), 2), ("tgt2src", len(pairs), 2)]
    assert capsys.readouterr().out.count("outputs equal") == 2


def test_each_weight_scores_what_self_reranking_decodes_with_it(tmp_path, capsys):
    pairs, model = _workdir(tmp_path)
    report = rerank_weight.main(["--workdir", str(tmp_path), "--weights", "0", "1", "3", "--beam", "4",
                                 "--batch", "5", "--device", "cpu", "--out", str(tmp_path / "hyp")])
    assert json.loads(capsys.readouterr().out)["best_weight"] == report["best_weight"]
    sp = sentencepiece.SentencePieceProcessor(model_file=str(tmp_path / "spm.model"))
    outputs: dict[str, set] = {}
    for direction, column in (("src2tgt", 0), ("tgt2src", 1)):
        inputs, references = [p[column] for p in pairs], [p[1 - column] for p in pairs]
        for weight in (0.0, 1.0, 3.0):
            decoded = translate_ids(model, encode_lines(sp, inputs), direction, "beam", 64, beam_size=4, rerank="self",
                                    rerank_weight=weight)
            texts = [sp.decode(h) for h in decoded]
            assert (tmp_path / "hyp" / f"valid.{direction}.w{weight}.txt").read_text(encoding="utf-8") == \
                "".join(t + "\n" for t in texts)
            assert report["bleu"][direction][str(weight)] == round(corpus_scores(texts, references)["bleu"], 2)
            outputs.setdefault(direction, set()).add(tuple(texts))
    assert any(len(variants) > 1 for variants in outputs.values())  # the weight changes some pick
    assert report["best_weight"] in (0.0, 1.0, 3.0)
    assert report["mean_bleu"][str(report["best_weight"])] == max(report["mean_bleu"].values())
    # --penalties: the grid of the beam's blank penalty c × w, each exactly what translate_ids decodes with both
    grid = rerank_weight.main(["--workdir", str(tmp_path), "--weights", "0", "1", "--penalties", "0", "3", "--beam", "4",
                               "--batch", "5", "--device", "cpu", "--out", str(tmp_path / "grid")])
    capsys.readouterr()
    for direction, column in (("src2tgt", 0), ("tgt2src", 1)):
        inputs, references = [p[column] for p in pairs], [p[1 - column] for p in pairs]
        for penalty in (0.0, 3.0):
            for weight in (0.0, 1.0):
                decoded = translate_ids(model, encode_lines(sp, inputs), direction, "beam", 64, beam_size=4,
                                        rerank="self", rerank_weight=weight, blank_penalty=penalty)
                texts = [sp.decode(h) for h in decoded]
                assert (tmp_path / "grid" / f"valid.{direction}.c{penalty}.w{weight}.txt").read_text(encoding="utf-8") \
                    == "".join(t + "\n" for t in texts)
                assert grid["bleu"][direction][f"c{penalty}/w{weight}"] == round(corpus_scores(texts, references)["bleu"], 2)
    assert grid["mean_bleu"]["c{}/w{}".format(*grid["best"])] == max(grid["mean_bleu"].values())
