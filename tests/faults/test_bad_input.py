"""The fault suite, part three: each class of bad input through `run_pipeline.py`, tracked in MLflow.

Every case must end with exit code 2 and, as the last line on stderr, one `error:` line naming the file
(and line) or the key, with no traceback; publish no stage directory; leave no MLflow run RUNNING; and once
the input is fixed, the same command must complete.
"""
from __future__ import annotations

import gzip
import re
from pathlib import Path

import pytest

import run_pipeline
from tests.pipeline.conftest import write_files_corpus

SMOKE = Path(run_pipeline.__file__).resolve().parent / "configs" / "smoke.yaml"


def _damage(corpus: Path, config: Path, case: str) -> tuple[list[str], str]:
    """Break the corpus or the config as `case` says; returns (extra arguments, the expected error pattern)."""
    de = corpus / "train.de"
    if case == "misaligned sides":
        de.write_text("".join(de.read_text(encoding="utf-8").splitlines(keepends=True)[:-3]), encoding="utf-8")
        return [], rf"{corpus / 'train.en'} has 300 lines but {de} has 297"
    if case == "invalid UTF-8":
        lines = de.read_bytes().split(b"\n")
        lines[6] = b"Der Hund \xff\xfe l\xe4uft"
        de.write_bytes(b"\n".join(lines))
        return [], rf"{de}:7: invalid UTF-8"
    if case == "corrupt gzip":
        packed = gzip.compress(de.read_bytes())
        de.unlink()
        (corpus / "train.de.gz").write_bytes(packed[:10] + b"\xff" * 20 + packed[30:])
        return [], rf"{corpus / 'train.de.gz'}:1: corrupt gzip file"
    if case == "missing file":
        de.unlink()
        return [], rf"{corpus}.*train\.de"
    if case == "empty corpus":
        for path in corpus.glob("train.*"):
            path.write_text("", encoding="utf-8")
        return [], rf"{corpus / 'train.en'}.*empty|no .*pairs"
    if case == "decompression bomb":
        (corpus / "train.de.gz").write_bytes(gzip.compress(b"Ein Hund.\n" * 150_000))
        de.unlink()
        return ["data.max_input_mb=1"], rf"{corpus / 'train.de.gz'}: more than data\.max_input_mb=1 MB once decompressed"
    if case == "YAML syntax":
        config.write_text(SMOKE.read_text(encoding="utf-8") + "train:\n  lr: [0.1\n", encoding="utf-8")
        return [], rf"{config}:\d+:\d+: invalid YAML"
    if case == "config not UTF-8":
        config.write_bytes(SMOKE.read_bytes() + b"# caf\xe9\n")
        return [], rf"{config}:\d+: not UTF-8"
    if case == "unknown key":
        return ["train.lr_max=1"], r"unknown key 'train\.lr_max'"
    if case == "value out of range":
        return ["model.n_heads=0"], r"model\.n_heads: .*got 0"
    if case == "non-finite number":
        return ["train.lr=.nan"], r"train\.lr: expected a finite number, got nan"
    if case == "empty workdir":
        return ["workdir="], r"workdir: must not be empty"
    if case == "CR-only line endings":  # inputs that are not what they look like from here on
        en = corpus / "test.en"
        en.write_bytes(en.read_bytes().replace(b"\n", b"\r"))
        return [], rf"{en}:1: U\+000D \(CARRIAGE RETURN\) at character \d+"
    if case == "NUL in a line":
        en = corpus / "train.en"
        en.write_bytes(en.read_bytes().replace(b"\n", b" \x00\n", 5).replace(b" \x00\n", b"\n", 4))
        return [], rf"{en}:5: U\+0000 \(NUL\) at character \d+"
    if case == "key given twice":
        config.write_text(SMOKE.read_text(encoding="utf-8") + "workdir: runs/other\n", encoding="utf-8")
        return [], rf"{config}:\d+: key 'workdir' given twice \(lines 4 and \d+\)"
    if case == "second section":
        config.write_text(SMOKE.read_text(encoding="utf-8") + "train:\n  lr: 0.1\n", encoding="utf-8")
        return [], rf"{config}:\d+: key 'train' given twice \(lines \d+ and \d+\)"
    if case == "plain and gzipped file":
        (corpus / "train.en.gz").write_bytes(gzip.compress((corpus / "train.en").read_bytes()))
        return [], rf"ambiguous input in {corpus}: train\.en and train\.en\.gz"
    raise AssertionError(case)


CASES = ["misaligned sides", "invalid UTF-8", "corrupt gzip", "missing file", "empty corpus", "decompression bomb",
         "YAML syntax", "config not UTF-8", "unknown key", "value out of range", "non-finite number", "empty workdir",
         "CR-only line endings", "NUL in a line", "key given twice", "second section", "plain and gzipped file"]


@pytest.mark.parametrize("case", CASES)
def test_bad_input_is_one_line_nothing_published_and_fixed_input_completes(tmp_path, capsys, case):
    import mlflow

    corpus = write_files_corpus(tmp_path / "corpus")
    config = tmp_path / "config.yaml"
    config.write_text(SMOKE.read_text(encoding="utf-8"), encoding="utf-8")
    workdir = tmp_path / "work"
    args = [f"workdir={workdir}", "data.source=files", f"data.local_dir={corpus}", "data.src_lang=en",
            "data.tgt_lang=de", "tracking.enabled=true", "--stages", "ingest"]
    extra, expected = _damage(corpus, config, case)
    assert run_pipeline.main(["--config", str(config), *args, *extra]) == 2
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]
    assert re.match(rf"error: .*({expected})", last), last
    assert "Traceback" not in err
    assert not list(workdir.glob("ingest-*")) and not list(workdir.glob(".*.tmp"))
    if (workdir / "mlflow.db").exists():
        mlflow.set_tracking_uri(f"sqlite:///{workdir}/mlflow.db")
        runs = mlflow.search_runs(experiment_names=["duplex"], output_format="list")
        assert runs and all(r.info.status == "FAILED" for r in runs)  # on record, none left RUNNING

    write_files_corpus(corpus)  # the input fixed, the same command completes
    for stray in corpus.glob("*.gz"):
        stray.unlink()
    config.write_text(SMOKE.read_text(encoding="utf-8"), encoding="utf-8")
    fixed = [a for a in extra if a.startswith("data.max_input_mb")]
    assert run_pipeline.main(["--config", str(config), *args, *fixed]) == 0
    assert len(list(workdir.glob("ingest-*/_SUCCESS"))) == 1
