"""The machine's failures through `run_pipeline.py`, as families: every errno of `stage.ENVIRONMENT` (a full disk,
a quota, a read-only or unwritable path, too many open files, a path too long, an I/O error, a path that vanished)
at every place a stage writes (its lock file, its temporary directory, a split's directory and Parquet files, its
JSON, its manifest, the rename that publishes it, `_SUCCESS`, the run's record, another stage's own file).

Each write is made to fail on its first call, as the machine fails it; every case must end with exit code 2 and,
as the last line on stderr, one `error:` line naming the path, what failed, the errno and the errno's own hint,
with no traceback; no stage directory without `_SUCCESS` and nothing `.tmp` may be left in the workdir; tracked,
every run the invocation opened ends FAILED with that line, and the same command then completes. Two real
failures, not patched: ENOSPC from /dev/full, and a read-only workdir (not as root, whom permissions do not stop).
"""
from __future__ import annotations

import builtins
import errno
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import pyarrow.parquet as pq
import pytest

import run_pipeline
from pipeline import graph, stage
from pipeline.tracking.store import STAGE_TAG
from tests.pipeline.conftest import write_files_corpus

SMOKE = Path(run_pipeline.__file__).resolve().parent / "configs" / "smoke.yaml"

# What each errno's line must tell the user to do (written out here, not taken from pipeline/stage.py).
HINTS = {
    errno.ENOSPC: r"free space on its filesystem \(.*free.*\) or point workdir= at a larger filesystem",
    errno.EDQUOT: r"free space within your disk quota \(quota -s; .*\) or point workdir= elsewhere",
    errno.EROFS: r"the workdir is read-only: point workdir= at a directory you can write",
    errno.EACCES: r"the workdir is not writable .*: point workdir= at a directory you can write",
    errno.EPERM: r"the workdir is not writable .*: point workdir= at a directory you can write",
    errno.EMFILE: r"this process has too many files open: raise its limit \(ulimit -n \d+\)",
    errno.ENFILE: r"the system has too many files open: .*fs\.file-max \(sysctl\)",
    errno.ENAMETOOLONG: r"the path is too long .*: point workdir= at a shorter path",
    errno.EIO: r"the disk failed .*: check it .* or point workdir= at another disk",
    errno.ENOENT: r"something removed it during the run .*",
}
ERRNOS = sorted(HINTS, key=errno.errorcode.get)


@dataclass(frozen=True)
class Site:
    """A place a run writes: `owner.attribute` is the function that writes, `pick(*args)` the path of a call
    that writes there (None: another call, passed through); `stages` the run's --stages; `what` the part of
    the line that says what failed; `named` whether the machine's error names the file (pyarrow's does not)."""

    owner: Any
    attribute: str
    pick: Callable[..., Optional[Path]]
    what: str
    stages: str = "ingest"
    named: bool = True


def _named(name: str) -> Callable[..., Optional[Path]]:
    return lambda path, *_: Path(path) if Path(path).name == name else None


SITES = {
    "lock file": Site(stage, "open", lambda path, *_: Path(path) if str(path).endswith(".lock") else None,
                      "stage ingest could not create its lock file"),
    "temporary directory": Site(Path, "mkdir", lambda path, *_: path if re.fullmatch(r"\.ingest-\w+\.tmp", path.name)
                                else None, "stage ingest could not create its temporary directory"),
    "split directory": Site(Path, "mkdir", lambda path, *_: path if path.parent.name.endswith(".tmp") else None,
                            "stage ingest could not build its output"),
    "Parquet file": Site(pq, "write_table", lambda table, path, *_: Path(path), "stage ingest could not build its output",
                         named=False),
    "report.json": Site(Path, "write_text", _named(".report.json.tmp"), "stage ingest could not build its output"),
    "manifest": Site(Path, "write_text", _named(f".{stage.MANIFEST}.tmp"), "stage ingest could not write its manifest"),
    "publishing rename": Site(os, "replace", lambda source, *_: Path(source) if Path(source).is_dir() else None,
                              r"stage ingest could not publish its output \(rename into place\)"),
    "_SUCCESS": Site(Path, "write_text", _named(f".{stage.SUCCESS}.tmp"),
                     rf"stage ingest could not mark its output finished \({stage.SUCCESS}\)"),
    "run record": Site(Path, "write_text", _named(".last_run.json.tmp"), "the run could not write its record"),
    "spm model": Site(Path, "write_bytes", _named("spm.model"), "stage spm could not build its output",
                      stages="ingest,spm"),
}


def _fail_first(monkeypatch: pytest.MonkeyPatch, site: Site, code: int) -> list[Path]:
    """Make the site's first write fail with `code` as the machine would (a file write gets half its data out
    first); returns the list that gets the failed path."""
    real = getattr(site.owner, site.attribute, None) or getattr(builtins, site.attribute)
    failed: list[Path] = []

    def fake(*args: Any, **kwargs: Any) -> Any:
        path = None if failed else site.pick(*args)
        if path is None:
            return real(*args, **kwargs)
        failed.append(path)
        if site.attribute in ("write_text", "write_bytes"):
            real(args[0], args[1][: len(args[1]) // 2], **kwargs)
        if not site.named:  # as pyarrow raises it
            raise OSError(code, f"Error writing bytes to file. Detail: [errno {code}] {os.strerror(code)}")
        if site.attribute == "replace":
            raise OSError(code, os.strerror(code), str(args[0]), None, str(args[1]))
        raise OSError(code, os.strerror(code), str(path))

    monkeypatch.setattr(site.owner, site.attribute, fake, raising=False)
    return failed


def _arguments(tmp_path: Path, stages: str, tracked: bool) -> list[str]:
    """A run of `stages` (none: the options of `run_pipeline.py tune`) on a tiny corpus, in tmp_path/work."""
    corpus = write_files_corpus(tmp_path / "corpus", {"train": 60, "valid": 10, "test": 10})
    return ["--config", str(SMOKE), f"workdir={tmp_path / 'work'}", "data.source=files", f"data.local_dir={corpus}",
            "data.src_lang=en", "data.tgt_lang=de", "spm.sample_size=100", "model.vocab_size=64",
            f"tracking.enabled={str(tracked).lower()}", *(["--stages", stages] if stages else [])]


def _check_failed_run(workdir: Path, err: str, pattern: str) -> str:
    """The run's stderr ends in one line matching `pattern`, without a traceback, and the workdir holds no
    unfinished stage directory and nothing `.tmp`; returns the line."""
    last = err.strip().splitlines()[-1]
    assert re.fullmatch(pattern, last), last
    assert "Traceback" not in err, err
    unfinished = [path.name for name in graph.PIPELINE for path in workdir.glob(f"{name}-*")
                  if not (path / stage.SUCCESS).is_file()]
    assert not unfinished, unfinished
    assert not list(workdir.rglob("*.tmp")), list(workdir.rglob("*.tmp"))
    return last


def _line(path: Path, what: str, code: int) -> str:
    return (rf"error: {re.escape(str(path))}: {what} \({errno.errorcode[code]}: {re.escape(os.strerror(code))}\); "
            rf"{HINTS[code]}, then run the same command again")


@pytest.mark.parametrize("code", ERRNOS, ids=errno.errorcode.get)
@pytest.mark.parametrize("where", SITES)
def test_an_os_error_at_any_write_is_one_line_naming_path_failure_and_hint(tmp_path, capsys, monkeypatch, where,
                                                                          code):
    site = SITES[where]
    failed = _fail_first(monkeypatch, site, code)
    assert run_pipeline.main(_arguments(tmp_path, site.stages, tracked=False)) == 2
    assert failed, f"{where}: never written"
    _check_failed_run(tmp_path / "work", capsys.readouterr().err, _line(failed[0], site.what, code))
    finished = {path.parent.name.split("-")[0] for path in (tmp_path / "work").glob(f"*/{stage.SUCCESS}")}
    assert finished == ({"ingest"} if where in ("run record", "spm model") else set())  # the stages before stay


@pytest.mark.parametrize("code", ERRNOS, ids=errno.errorcode.get)
def test_a_sweep_that_meets_one_is_one_line_too(tmp_path, capsys, monkeypatch, code):
    """`run_pipeline.py tune` runs the data stages first: the same line (Ray is not needed to get there)."""
    monkeypatch.setattr(run_pipeline, "connect_ray", lambda cfg: None)
    site = SITES["Parquet file"]
    failed = _fail_first(monkeypatch, site, code)
    assert run_pipeline.main(["tune", *_arguments(tmp_path, "", tracked=False)]) == 2
    _check_failed_run(tmp_path / "work", capsys.readouterr().err, _line(failed[0], site.what, code))


@pytest.mark.parametrize("where", ["Parquet file", "_SUCCESS", "spm model"])  # each run opens a new MLflow store: ~5 s
def test_a_full_disk_leaves_the_tracked_runs_failed_and_the_same_command_completes(tmp_path, capsys, monkeypatch,
                                                                                   where):
    import mlflow

    site = SITES[where]
    workdir = tmp_path / "work"
    failed = _fail_first(monkeypatch, site, errno.ENOSPC)
    arguments = _arguments(tmp_path, site.stages, tracked=True)
    assert run_pipeline.main(arguments) == 2
    line = _check_failed_run(workdir, capsys.readouterr().err, _line(failed[0], site.what, errno.ENOSPC))
    mlflow.set_tracking_uri(f"sqlite:///{workdir}/mlflow.db")
    runs = mlflow.search_runs(experiment_names=["duplex"], output_format="list")
    names = {run.data.tags[STAGE_TAG]: run for run in runs}
    assert set(names) == {"pipeline", *site.stages.split(",")}, names
    failing = names[site.stages.split(",")[-1]]
    assert failing.info.status == names["pipeline"].info.status == "FAILED"
    assert line.removeprefix("error: ") in failing.data.tags["error"]
    monkeypatch.undo()  # the disk has room again
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert run_pipeline.main(arguments) == 0
    assert {path.parent.name.split("-")[0] for path in workdir.glob(f"*/{stage.SUCCESS}")} == set(site.stages.split(","))


def _is_device(path: str) -> bool:
    return os.path.exists(path) and stat.S_ISCHR(os.stat(path).st_mode)


@pytest.mark.skipif(not _is_device("/dev/full"), reason="needs the /dev/full device")
def test_a_real_full_disk_is_one_line(tmp_path, capsys):
    """/dev/full answers every write with ENOSPC, and the error names no file: the line names the one written."""
    workdir = tmp_path / "work"
    workdir.mkdir()
    (workdir / ".last_run.json.tmp").symlink_to("/dev/full")
    assert run_pipeline.main(_arguments(tmp_path, "ingest", tracked=False)) == 2
    _check_failed_run(workdir, capsys.readouterr().err,
                      _line(workdir / ".last_run.json.tmp", "the run could not write its record", errno.ENOSPC))
    assert _is_device("/dev/full")  # the symlink went, not the device


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only directory")
def test_a_real_read_only_workdir_is_one_line(tmp_path, capsys):
    workdir = tmp_path / "work"
    workdir.mkdir()
    workdir.chmod(0o555)
    try:
        assert run_pipeline.main(_arguments(tmp_path, "ingest", tracked=False)) == 2
        lock = rf"{re.escape(str(workdir))}/\.ingest-\w+\.lock"
        _check_failed_run(workdir, capsys.readouterr().err, rf"error: {lock}: stage ingest could not create its lock "
                          rf"file \(EACCES: {os.strerror(errno.EACCES)}\); {HINTS[errno.EACCES]}, then run the same "
                          rf"command again")
    finally:
        workdir.chmod(0o755)


@pytest.mark.parametrize("words", sorted(stage.STORE_WORDS))
@pytest.mark.parametrize("method", ["begin_stage", "end_stage"])
def test_an_mlflow_store_that_cannot_be_written_is_one_line_naming_its_file(tmp_path, capsys, monkeypatch, words,
                                                                            method):
    """sqlite's "database or disk is full" and "attempt to write a readonly database" reach the run as MLflow's
    (or SQLAlchemy's) exceptions, not as OSErrors: the line names the store's file and says what to do, as for a
    stage's own writes."""
    from mlflow.exceptions import MlflowException

    from pipeline.tracking.runs import Tracker

    def refuse(*args, **kwargs):
        try:
            raise RuntimeError(f"(sqlite3.OperationalError) {words}")  # SQLAlchemy's, as MLflow chains it
        except RuntimeError as error:
            raise MlflowException(f"(sqlite3.OperationalError) {words}") from error

    monkeypatch.setattr(Tracker, method, refuse)
    assert run_pipeline.main(_arguments(tmp_path, "ingest", tracked=True)) == 2
    code = stage.STORE_WORDS[words]
    store = (tmp_path / "work" / "mlflow.db").resolve()
    pattern = (rf"error: {re.escape(str(store))}: the run failed on it: the MLflow store could not be written "
               rf"\({errno.errorcode[code]}: {re.escape(os.strerror(code))}\); {HINTS[code]}, then run the same "
               rf"command again")
    _check_failed_run(tmp_path / "work", capsys.readouterr().err, pattern)
