import json

import pytest

from pipeline.stage import SUCCESS, StageError, digest, is_done, require_done, run_stage, stage_dir


def test_digest_is_stable_and_order_independent():
    assert digest({"a": 1, "b": [1, 2]}) == digest({"b": [1, 2], "a": 1})
    assert digest({"a": 1}) != digest({"a": 2})


def test_stage_dir_depends_on_the_key(tmp_path):
    assert stage_dir(tmp_path, "spm", {"v": 1}) == stage_dir(tmp_path, "spm", {"v": 1})
    assert stage_dir(tmp_path, "spm", {"v": 1}) != stage_dir(tmp_path, "spm", {"v": 2})
    assert stage_dir(tmp_path, "spm", {"v": 1}).name.startswith("spm-")


def _build_counting(calls):
    def build(tmp):
        calls.append(tmp)
        (tmp / "data.txt").write_text("payload")
        return {"rows": 3}
    return build


def test_run_stage_publishes_atomically_and_skips_when_done(tmp_path):
    out = tmp_path / "demo-abc"
    calls = []
    assert run_stage("demo", out, _build_counting(calls), config={"x": 1}, inputs={}) == out
    assert is_done(out) and (out / "data.txt").read_text() == "payload"
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["counts"] == {"rows": 3} and manifest["config"] == {"x": 1}
    run_stage("demo", out, _build_counting(calls), config={"x": 1}, inputs={})
    assert len(calls) == 1  # skipped
    run_stage("demo", out, _build_counting(calls), config={"x": 1}, inputs={}, force=True)
    assert len(calls) == 2
    assert not list(tmp_path.glob(".demo-abc.tmp*"))


def test_failed_build_leaves_nothing_and_unfinished_output_is_redone(tmp_path):
    out = tmp_path / "demo-abc"

    def failing(tmp):
        (tmp / "half.txt").write_text("half")
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        run_stage("demo", out, failing, config={}, inputs={})
    assert not out.exists()
    assert [p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")] == []
    # an output directory without _SUCCESS (crash between rename and marker) is not trusted
    out.mkdir()
    (out / "stale.txt").write_text("stale")
    calls = []
    run_stage("demo", out, _build_counting(calls), config={}, inputs={})
    assert len(calls) == 1 and not (out / "stale.txt").exists() and (out / SUCCESS).exists()


def test_require_done_names_the_missing_stage(tmp_path):
    with pytest.raises(StageError, match="stage 'ingest' has no finished output"):
        require_done(tmp_path / "ingest-123", "ingest")
