"""The teacher stage's checks of given teacher checkpoints (when it is needed: test_graph.py); training through
Ray Train runs in the smoke pipeline test (tests/pipeline/test_run_pipeline.py)."""
from pathlib import Path

import pytest

from pipeline import graph
from pipeline.config import ConfigError, load_config
from pipeline.stage import StageRun
from pipeline.stages import teacher
from reder import TransformerConfig
from reder.autoregressive import Transformer
from reder.checkpoint import save_model_dir
from tests.reder.helpers import tiny_model


def _teacher_dir(tmp_path: Path, name: str, vocab_size: int, direction: str, spm_bytes: bytes = b"spm") -> Path:
    spm_file = tmp_path / f"{name}.spm"
    spm_file.write_bytes(spm_bytes)
    model = Transformer(TransformerConfig(vocab_size=vocab_size, d_model=8, n_heads=2, ffn_dim=16, encoder_layers=1,
                                          decoder_layers=1, max_positions=32))
    return save_model_dir(tmp_path / name, model, spm_file, "en", "de", extra={"direction": direction})


def test_given_teacher_checkpoints_are_checked_with_clear_errors(tmp_path):
    cfg = load_config(None, ["model.vocab_size=64"])
    spm_file = tmp_path / "run.spm"
    spm_file.write_bytes(b"spm")
    good = _teacher_dir(tmp_path, "good", 64, "src2tgt")
    assert isinstance(teacher.check_teacher(good, "src2tgt", cfg, spm_file), Transformer)
    with pytest.raises(ValueError, match="translates .src2tgt., but .tgt2src. was asked for"):
        teacher.check_teacher(good, "tgt2src", cfg, spm_file)
    with pytest.raises(ValueError, match="vocabulary mismatch: teacher has 80 pieces"):
        teacher.check_teacher(_teacher_dir(tmp_path, "big", 80, "src2tgt"), "src2tgt", cfg, spm_file)
    with pytest.raises(Exception, match="vocabulary mismatch: .* is not this run's SentencePiece model"):
        teacher.check_teacher(_teacher_dir(tmp_path, "other", 64, "src2tgt", b"other"), "src2tgt", cfg, spm_file)
    with pytest.raises(FileNotFoundError, match="nowhere"):
        teacher.check_teacher(tmp_path / "nowhere", "src2tgt", cfg, spm_file)
    reder_dir = save_model_dir(tmp_path / "reder", tiny_model(vocab_size=64), spm_file, "en", "de")
    with pytest.raises(ValueError, match="not a transformer|transformer"):
        teacher.check_teacher(reder_dir, "src2tgt", cfg, spm_file)


def test_given_checkpoints_are_checked_and_change_the_stage_directory(tmp_path):
    with pytest.raises(ConfigError, match="evaluate.rerank"):
        load_config(None, ["evaluate.rerank=teacher", "evaluate.beam_size=1"])
    with pytest.raises(ConfigError, match="both"):
        load_config(None, [f"teacher.src2tgt_checkpoint={tmp_path}"])
    given = load_config(None, [f"teacher.src2tgt_checkpoint={tmp_path}/a", f"teacher.tgt2src_checkpoint={tmp_path}/b",
                               f"workdir={tmp_path}"])
    assert teacher.given_checkpoints(given) == {"src2tgt": tmp_path / "a", "tgt2src": tmp_path / "b"}
    trained = load_config(None, [f"workdir={tmp_path}"])
    assert graph.output_dir(given, tmp_path, "teacher") != graph.output_dir(trained, tmp_path, "teacher")
    assert graph.output_dir(trained, tmp_path, "teacher") != graph.output_dir(
        load_config(None, [f"workdir={tmp_path}", "teacher.model.d_model=256"]), tmp_path, "teacher")


def test_teacher_vocabulary_follows_the_model_and_cannot_disagree():
    assert load_config(None, ["model.vocab_size=300"]).teacher.model.vocab_size == 300
    with pytest.raises(ConfigError, match="teacher.model.vocab_size"):
        load_config(None, ["model.vocab_size=300", "teacher.model.vocab_size=200"])


@pytest.mark.parametrize("force", [False, True])
def test_force_retrains_both_teachers_from_scratch(tmp_path, monkeypatch, force):
    """The teachers' one Ray Train run (named as the stage's directory) is removed before fitting with
    --force (it would resume, finished), kept without it."""
    cfg = load_config(None, [f"workdir={tmp_path}"])
    (tmp_path / "ray_results" / "teacher-abc" / "checkpoint_000002").mkdir(parents=True)
    seen = {}

    def make_trainer(cfg, name, storage, *args, **kwargs):
        seen.update({"name": name, "kept": (storage / "teacher-abc").exists(), "task": kwargs["task"]})
        raise StopIteration  # stop where Ray Train would start

    monkeypatch.setattr(teacher.raytrain, "check_resources", lambda *args: None)
    monkeypatch.setattr(teacher.raytrain, "make_trainer", make_trainer)
    run = StageRun(cfg=cfg, workdir=tmp_path, out=tmp_path / "teacher-abc", force=force,
                   inputs={label: tmp_path / label for label in ("data", "ingest", "spm")})
    with pytest.raises(StopIteration):
        teacher.build(run, tmp_path / "tmp")
    assert seen == {"name": "teacher-abc", "kept": not force, "task": {"kind": "teacher"}}


def test_one_ray_train_run_trains_both_teachers_and_resumes_after_a_worker_failure(tmp_path, ray_session):
    """The teacher stage starts one worker group for both directions (one Ray Train run, named as the
    stage's directory); a worker that fails after step 3 (the fault drill) is restarted from the checkpoint of step
    2 with both teachers, their optimizer and position; each direction's averaged model is published and loads as
    that direction's teacher, with the history, training.png and report.json of the one run beside them."""
    import json

    from reder.checkpoint import load_teacher_dir
    from tests.pipeline.test_cmlm import TINY, VOCAB, _inputs

    inputs, _, _ = _inputs(tmp_path)
    tiny = [option.replace("cmlm.", "teacher.") for option in TINY]
    cfg = load_config(None, [f"model.vocab_size={VOCAB}", "data.src_lang=en", "data.tgt_lang=de", f"workdir={tmp_path}",
                             *tiny, "teacher.train.fail_at_step=3", "teacher.train.max_failures=1"])
    out = tmp_path / "out"
    run = StageRun(cfg=cfg, workdir=tmp_path, out=tmp_path / "teacher-test",
                   inputs={"data": inputs["tokenize"], "ingest": inputs["ingest"], "spm": inputs["spm"]})
    counts = teacher.build(run, out)
    assert {d: (c["steps"], c["restarts"]) for d, c in counts.items()} == {"src2tgt": (4, 1), "tgt2src": (4, 1)}
    assert sorted(p.name for p in (tmp_path / "ray_results").iterdir()) == ["teacher-test"]
    history = json.loads((out / "history.json").read_text())
    assert [h["step"] for h in history if "resumed_from" in h] == [2]
    validated = [h for h in history if "valid_bleu" in h]
    assert [h["step"] for h in validated] == [2, 4]
    for h in validated:
        assert h["valid_bleu"] == pytest.approx((h["bleu_src2tgt"] + h["bleu_tgt2src"]) / 2)
        assert {"valid_nll_src2tgt", "valid_nll_tgt2src", "grad_norm_src2tgt", "grad_norm_tgt2src"} <= set(h)
    for direction, path in teacher.model_dirs(out).items():
        assert path == (out / direction / "model").resolve()
        assert isinstance(load_teacher_dir(path, direction, VOCAB), Transformer)
        # the direction's BLEU at the best checkpoint by the mean (of equals the later)
        best = max(validated, key=lambda h: (h["valid_bleu"], h["step"]))
        assert counts[direction]["best_valid_bleu"] == best[f"bleu_{direction}"]
    assert json.loads((out / "report.json").read_text())["restarts"] == 1 and (out / "training.png").is_file()
