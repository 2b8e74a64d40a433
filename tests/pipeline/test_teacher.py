"""The teacher stage's checks of given teacher checkpoints (when it is needed: test_graph.py); training through
Ray Train runs in the smoke pipeline test (tests/pipeline/test_run_pipeline.py)."""
from pathlib import Path

import pytest

from pipeline import graph, teacher
from pipeline.config import ConfigError, load_config
from pipeline.stage import StageRun
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
    """Each direction's Ray Train run (`<stage dir>-<direction>`) is removed before fitting with --force
    (it would resume, finished), kept without it."""
    cfg = load_config(None, [f"workdir={tmp_path}"])
    for direction in ("src2tgt", "tgt2src"):
        (tmp_path / "ray_results" / f"teacher-abc-{direction}" / "checkpoint_000002").mkdir(parents=True)
    seen = {}

    def make_trainer(cfg, name, storage, *args, **kwargs):
        seen.update({d: (storage / f"teacher-abc-{d}").exists() for d in ("src2tgt", "tgt2src")})
        raise StopIteration  # stop where Ray Train would start

    monkeypatch.setattr(teacher.raytrain, "check_resources", lambda *args: None)
    monkeypatch.setattr(teacher.raytrain, "make_trainer", make_trainer)
    run = StageRun(cfg=cfg, workdir=tmp_path, out=tmp_path / "teacher-abc", force=force,
                   inputs={label: tmp_path / label for label in ("data", "ingest", "spm")})
    with pytest.raises(StopIteration):
        teacher.build(run, tmp_path / "tmp")
    assert seen == {"src2tgt": not force, "tgt2src": not force}
