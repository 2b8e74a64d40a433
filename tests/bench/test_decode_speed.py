"""bench.decode_speed on a run directory built from tiny models: every decoder timed (by a fake clock of known
times), every speed-up the one those times give."""
from __future__ import annotations

import json

import pytest

from bench import decode_speed
from pipeline.config import load_config
from reder import REDER, ModelConfig
from reder.checkpoint import save_model_dir
from tests.pipeline.conftest import DecoderClock
from tests.pipeline.test_evaluate import VOCAB, _corpus, _teacher_stage


def test_times_reder_and_teacher_decoders_of_a_run(tmp_path, capsys, monkeypatch):
    _, corpus = _corpus(tmp_path)
    model = REDER(ModelConfig(vocab_size=VOCAB, d_model=8, n_heads=2, ffn_dim=16, layers_per_end=1)).eval()
    train_dir = tmp_path / "train"
    save_model_dir(train_dir / "model", model, tmp_path / "spm.model", "en", "de")
    cfg = load_config(None, [f"model.vocab_size={VOCAB}"])
    stages = {"ingest": corpus, "teacher": _teacher_stage(tmp_path), "train": train_dir}
    (tmp_path / "last_run.json").write_text(json.dumps(
        {"config": cfg.to_dict(), "stages": {name: {"output": str(path)} for name, path in stages.items()}}))
    # timed by a fake clock: (seconds per sentence at batch 1, seconds of the call at batch 4) of each decoder
    clock = DecoderClock({"greedy": (0.001, 0.01), "beam3": (0.004, 0.025), "beam3_rerank": (0.01, 0.05),
                          "teacher_greedy": (0.005, 0.02), "teacher_beam4": (0.02, 0.1)}).install(monkeypatch)
    report = decode_speed.main(["--workdir", str(tmp_path), "--sentences", "5", "--beam", "3", "--batch", "4",
                                "--device", "cpu"])
    assert json.loads(capsys.readouterr().out)["sentences"] == 5
    names = [row["decoder"] for row in report["summary"]]
    assert names == ["greedy", "beam3", "beam3_rerank", "teacher_greedy", "teacher_beam4"]
    speed = report["speed"]
    expected = clock.expected_speed(5, 4)
    assert {name: speed[name] for name in expected} == expected
    assert speed["speedup_greedy_vs_teacher_beam4_batch1"] == 20.0 and speed["speedup_beam3_rerank_vs_teacher_greedy_batch4"] == 0.4
    assert [row["speedup_vs_teacher_beam4_batch1"] for row in report["summary"]] == [20.0, 5.0, 2.0, None, None]
