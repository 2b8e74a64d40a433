import json
import re

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


def test_a_consumer_refuses_an_output_changed_since_it_was_published(tmp_path):
    """The manifest records every file's size and SHA-256; a flipped byte, a truncation, a deleted
    or an added file, and an unreadable manifest are each one StageError naming the file and the fix."""
    def build(tmp):
        (tmp / "part").mkdir()
        (tmp / "part" / "data.bin").write_bytes(bytes(range(200)))
        (tmp / "spm.model").write_bytes(b"model")
        return {}

    out = run_stage("demo", tmp_path / "demo-abc", build, config={}, inputs={})
    assert set(json.loads((out / "manifest.json").read_text())["files"]) == {"part/data.bin", "spm.model"}
    assert require_done(out, "demo") == out
    data = out / "part" / "data.bin"
    redo = "redo the stage: python run_pipeline.py --stages demo --force"
    for corrupt, problem in [
        (lambda: data.write_bytes(bytes(range(199)) + b"\x00"), "changed (SHA-256 differs)"),
        (lambda: data.write_bytes(bytes(range(100))), "has 100 bytes, 200 were written"),
        (lambda: data.unlink(), "is missing"),
    ]:
        corrupt()
        with pytest.raises(StageError, match=rf"^{data}: {re.escape(problem)} since stage 'demo' finished; {redo}$"):
            require_done(out, "demo")
        data.write_bytes(bytes(range(200)))
    require_done(out, "demo")
    (out / "stray.pt").write_bytes(b"")
    with pytest.raises(StageError, match=rf"^{out / 'stray.pt'}: not written by stage 'demo' \(added later\)"):
        require_done(out, "demo")
    (out / "stray.pt").unlink()
    (out / "manifest.json").write_text("{ truncated")
    with pytest.raises(StageError, match=rf"^{out / 'manifest.json'}: unreadable \(.*\); redo its stage: "
                                         r"python run_pipeline.py --stages demo --force$"):
        require_done(out, "demo")
