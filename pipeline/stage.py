"""Mechanics shared by every stage: the `Stage` declaration, hashed output directories, skip-when-done,
atomic publication. The stages themselves are declared in pipeline/graph.py.

A stage's output lives in `<workdir>/<stage>-<hash>/`, where the hash covers the config values the
stage depends on and the names of its hashed input directories (themselves hashed, so a change upstream
changes every directory downstream). The stage builds into `<workdir>/.<stage>-<hash>.tmp/`, writes
`manifest.json` there, renames the directory into place and writes `_SUCCESS` last. A directory without
`_SUCCESS` is never trusted: the next run deletes it and redoes the work. The manifest records every
file's size and SHA-256; a stage that consumes the output checks them first (`verify`), so a corrupted,
truncated or swapped file is an error naming it, not a crash deep inside a later stage. A lock file
serialises two runs of the same stage on the same workdir. An OSError of the machine while a stage runs (a full
disk, a read-only, unwritable or vanished path, too many open files, an I/O error: `ENVIRONMENT`) is an
`EnvironmentFailure`: one line naming the path, what failed, the errno and what to do, with nothing half-published.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import logging
import math
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

if TYPE_CHECKING:
    from pipeline.config import PipelineConfig

log = logging.getLogger(__name__)

SUCCESS = "_SUCCESS"
MANIFEST = "manifest.json"
# Fault drill (tests/faults): a stage named here waits at its `drill_hold` point, inside its own build with part
# of its work done, until the process is signalled, so that a kill lands inside a stage too short to catch
# otherwise (ingest, spm).
HOLD_ENV = "DUPLEX_HOLD_STAGE"


def drill_hold(name: str) -> None:
    """The fault drill's point in stage `name`'s own code: wait here while HOLD_ENV names the stage."""
    while os.environ.get(HOLD_ENV) == name:
        time.sleep(0.1)


class StageError(RuntimeError):
    """A stage cannot run (missing input, bad data); the message says what to do."""


class EnvironmentFailure(StageError):
    """The machine failed a read or write of the run (`ENVIRONMENT`); the message names the path, what failed, the
    errno and what to do (`environment_failure`)."""


# The errno values that are the machine's failures, not the pipeline's: `environment_failure` says what to do.
ENVIRONMENT = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EIO, errno.EMFILE,
                         errno.ENFILE, errno.ENAMETOOLONG, errno.ENOENT})
SIZE_WALK_LIMIT = 100_000  # files and directories counted for "the workdir holds ..." before giving up (a hint)


def environment_failure(error: BaseException, workdir: Path, what: str, where: Path | None = None, store: str = ""
                        ) -> EnvironmentFailure | None:
    """The EnvironmentFailure for `error` if it is an OSError of the machine (`ENVIRONMENT`; or the `cause` of an
    error Ray wrapped it in), else None: `<path>: <what> (<errno name>: <strerror>); <what to do>`. The path is
    the error's own, else `where` (pyarrow names none). A missing path is the machine's only in or above `workdir`
    (something removed it during the run); elsewhere it is an input's, which its reader names (or a bug)."""
    refused = _store_failure(error, store) if store else None
    if refused is not None:  # the MLflow store's sqlite said it (through SQLAlchemy and MLflow): no OSError reaches here
        code, named = refused
        return _failure(code, Path(named), workdir, f"{what}: the MLflow store could not be written", True)
    for _ in range(8):  # a RayTaskError is an instance of its cause's class but holds no errno of its own
        if isinstance(error, OSError) and error.errno in ENVIRONMENT:
            break
        error = getattr(error, "cause", None)
        if not isinstance(error, BaseException):
            return None
    else:
        return None
    named = error.filename if isinstance(error.filename, (str, bytes, os.PathLike)) else where
    if named is None:
        return None
    path, root = Path(os.path.abspath(os.fsdecode(named))), Path(os.path.abspath(workdir))
    inside = path.is_relative_to(root) or root.is_relative_to(path)  # in the workdir, or where it goes
    if error.errno == errno.ENOENT and not inside:
        return None
    return _failure(error.errno, path, workdir, what, inside)


def _failure(code: int, path: Path, workdir: Path, what: str, inside: bool) -> EnvironmentFailure:
    """`<path>: <what> (<errno name>: <strerror>); <what to do>, then run the same command again`."""
    path, workdir = Path(os.path.abspath(path)), Path(os.path.abspath(workdir))
    return EnvironmentFailure(f"{path}: {what} ({errno.errorcode[code]}: {os.strerror(code)}); "
                              f"{_what_to_do(code, path, workdir, inside)}, then run the same command again")


# What sqlite says when its file cannot be written, as MLflow passes it on (an MlflowException or SQLAlchemy's
# OperationalError, never an OSError): the errno it stands for.
STORE_WORDS = {"database or disk is full": errno.ENOSPC, "attempt to write a readonly database": errno.EROFS}


def _store_failure(error: BaseException, store: str) -> tuple[int, str] | None:
    """(errno, the store's file) when `error` (or what it was raised from) is sqlite refusing to write the MLflow
    store at tracking URI `store`: its file for a sqlite URI, else the URI."""
    seen = 0
    while error is not None and seen < 8:
        for words, code in STORE_WORDS.items():
            if words in str(error):
                return code, store.removeprefix("sqlite:///") if store.startswith("sqlite:///") else store
        error, seen = error.__cause__ or error.__context__, seen + 1
    return None


def _what_to_do(code: int, path: Path, workdir: Path, inside: bool) -> str:
    if code == errno.ENOSPC:
        return f"free space on its filesystem ({_room(path, workdir)}) or point workdir= at a larger filesystem"
    if code == errno.EDQUOT:
        return f"free space within your disk quota (quota -s; {_room(path, workdir)}) or point workdir= elsewhere"
    if code in (errno.EROFS, errno.EACCES, errno.EPERM):
        how = "read-only" if code == errno.EROFS else "not writable (or readable) for this user"
        if inside:
            return f"the workdir is {how}: point workdir= at a directory you can write"
        return f"it is {how}: fix its permissions, or point the setting that names it elsewhere"
    if code == errno.EMFILE:
        return "this process has too many files open: raise its limit (ulimit -n 65536)"
    if code == errno.ENFILE:
        return "the system has too many files open: stop other programs or raise fs.file-max (sysctl)"
    if code == errno.ENAMETOOLONG:
        return "the path is too long for the filesystem: point workdir= at a shorter path"
    if code == errno.EIO:
        return "the disk failed the operation: check it (dmesg, SMART) or point workdir= at another disk"
    return "something removed it during the run (a person, a cleaner of /tmp, another run's --force)"


def _room(path: Path, workdir: Path) -> str:
    """How much is free where `path` is, and how much the workdir holds (unless counting it would take long)."""
    parts = []
    with contextlib.suppress(OSError, StopIteration):
        parts.append(f"{_size(shutil.disk_usage(next(p for p in (path, *path.parents) if p.exists())).free)} free")
    held, count = 0, 0
    for root, dirs, files in os.walk(workdir):
        count += len(dirs) + len(files)
        if count > SIZE_WALK_LIMIT:
            break
        for name in files:
            with contextlib.suppress(OSError):
                held += os.lstat(os.path.join(root, name)).st_blocks * 512
    else:
        if held:
            parts.append(f"the workdir {workdir} holds {_size(held)}: finished stages it no longer needs can go")
    return "; ".join(parts) or "its usage unknown"


def _size(count: float) -> str:
    for unit in ("bytes", "KB", "MB", "GB", "TB"):
        if count < 1000 or unit == "TB":
            return f"{count:.0f} {unit}" if unit == "bytes" else f"{count:.1f} {unit}"
        count /= 1000
    return ""


@contextlib.contextmanager
def environment_errors(workdir: Path, what: str, where: Path | None = None, store: str = "") -> Iterator[None]:
    """Inside, an OSError of the machine (`environment_failure`) becomes an EnvironmentFailure: `what` failed at
    its path (else `where`); so does sqlite refusing to write the MLflow store at tracking URI `store`; any other
    error passes unchanged."""
    try:
        yield
    except StageError:
        raise
    except Exception as error:
        failure = environment_failure(error, workdir, what, where, store)
        if failure is None:
            raise
        raise failure from error


@dataclass(frozen=True)
class StageRun:
    """What a stage's `build` gets: the config, its own final output directory (`out.name` names its Ray
    Train runs), every input directory by label (finished, checked), the MLflow tracker (or None), and
    `force` (run_pipeline.py --force: redo from scratch, so a Ray Train run must not resume), `resume`
    (run_pipeline.py tune --resume: continue an interrupted sweep), `time_cap_s` (a training stage's share of
    the run's budget, `budget.max_time`: its training loop stops then, if its own max_time has not stopped it)."""

    cfg: "PipelineConfig"
    workdir: Path
    out: Path
    inputs: dict[str, Path]
    tracker: Any = None
    force: bool = False
    resume: bool = False
    time_cap_s: float = math.inf


@dataclass(frozen=True)
class Stage:
    """One node of the stage graph, declared once (pipeline/graph.py).

    `key(cfg)`: the config values in the stage's hash. `inputs(cfg)`: label → upstream stage whose
    directory name goes into the hash too (the label is the hash key, so it must never change for a
    stage whose hash is kept). `reads`: upstream stages read but not hashed (each is already upstream of a
    hashed input). `build(run, tmp) -> counts` writes the output into `tmp`. `sections`: config sections
    recorded whole in manifest.json. `uses_ray`: the build needs a connected Ray (run_pipeline.py
    connects once, before the first such stage). `summary(output, counts)`: the lines run_pipeline.py's
    summary prints under the stage's own. `needed_when`: the config keys that decide whether a run needs the
    stage (printed when it does not; empty: always needed)."""

    name: str
    build: Callable[[StageRun, Path], dict[str, Any]]
    key: Callable[["PipelineConfig"], dict[str, Any]]
    inputs: Callable[["PipelineConfig"], dict[str, str]] = lambda cfg: {}
    reads: Callable[["PipelineConfig"], tuple[str, ...]] = lambda cfg: ()
    sections: tuple[str, ...] = field(default=())
    uses_ray: bool = False
    summary: Callable[[Path, dict[str, Any]], list[str]] = lambda output, counts: []
    needed_when: tuple[str, ...] = ()


def split_lines(counts: dict[str, Any], splits: tuple[str, ...], reasons: Callable[[dict[str, Any]], dict[str, int]]
                ) -> list[str]:
    """Summary lines of a stage that filters pairs: per split, kept of read, and `reasons` (counts by reason) of
    what was dropped (train) or flagged and kept (valid, test)."""
    lines = []
    for split in splits:
        entry = counts.get(split)
        if isinstance(entry, dict):
            what = "dropped" if split == "train" else "flagged (kept)"
            lines.append(f"{split:<5} kept {entry['kept']:>8} of {entry['read']:>8}   {what}: {json.dumps(reasons(entry))}")
    return lines


def digest(value: Any, length: int = 12) -> str:
    """Stable short hash of a JSON-serialisable value."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:length]


# The stage-key scheme's version (pipeline/stagekeys.py). Version 1 is every directory name made so far: its
# digest holds no version field; a later version's holds {"version": n}, which gives every stage a new directory.
KEY_VERSION = 1


def stage_dir(workdir: Path, name: str, key: Any) -> Path:
    """Where stage `name` writes for this key (config section + input names), under the scheme's KEY_VERSION."""
    versioned = {"stage": name, "key": key, **({"version": KEY_VERSION} if KEY_VERSION > 1 else {})}
    return Path(workdir).resolve() / f"{name}-{digest(versioned)}"


def is_done(path: Path) -> bool:
    return (Path(path) / SUCCESS).is_file()


def require_done(path: Path, stage: str) -> Path:
    """Fail clearly when an upstream stage has not produced `path` yet, or when a file of it changed since
    (`verify`)."""
    if not is_done(path):
        raise StageError(f"stage {stage!r} has no finished output at {path}; run it first "
                         f"(python run_pipeline.py --stages {stage},...)")
    verify(path, stage)
    return path


def read_manifest(path: Path) -> dict[str, Any]:
    """A finished output's manifest.json; a StageError naming it when it cannot be read."""
    manifest = Path(path) / MANIFEST
    try:
        return json.loads(manifest.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise StageError(f"{manifest}: unreadable ({error}); redo its stage: python run_pipeline.py --stages "
                         f"{Path(path).name.rsplit('-', 1)[0]} --force") from error


def split_digest(directory: Path, split: str, length: int = 12) -> str:
    """A short digest of the files of a finished output's `split/` (from the SHA-256s its manifest recorded; no file
    is read): a dataset's fingerprint (the MLflow runs' datasets, pipeline/tracking/runs.py)."""
    files = read_manifest(directory).get("files") or {}
    return digest({name: entry["sha256"] for name, entry in files.items() if name.startswith(f"{split}/")}, length)


def fingerprint(directory: Path) -> dict[str, dict[str, Any]]:
    """Every file under `directory` but manifest.json and _SUCCESS: relative path -> {bytes, sha256}."""
    files = {}
    for path in sorted(Path(directory).rglob("*")):
        if path.is_file() and path.name not in (MANIFEST, SUCCESS):
            with open(path, "rb") as handle:
                sha = hashlib.file_digest(handle, "sha256").hexdigest()
            files[path.relative_to(directory).as_posix()] = {"bytes": path.stat().st_size, "sha256": sha}
    return files


def verify(path: Path, stage: str) -> None:
    """Raise a StageError naming the first file of a finished output that is missing, added, truncated or
    changed since its stage wrote it (sizes and SHA-256 recorded in manifest.json), and the command that
    redoes the stage. Outputs published before manifests recorded files are not checked."""
    recorded = read_manifest(path).get("files")
    if recorded is None:
        return
    found = fingerprint(path)
    redo = f"redo the stage: python run_pipeline.py --stages {stage} --force"
    for name, entry in recorded.items():
        now = found.get(name)
        problem = ("is missing" if now is None else
                   f"has {now['bytes']} bytes, {entry['bytes']} were written" if now["bytes"] != entry["bytes"] else
                   "changed (SHA-256 differs)" if now["sha256"] != entry["sha256"] else "")
        if problem:
            raise StageError(f"{Path(path) / name}: {problem} since stage {stage!r} finished; {redo}")
    added = sorted(set(found) - set(recorded))
    if added:
        raise StageError(f"{Path(path) / added[0]}: not written by stage {stage!r} (added later); remove it or {redo}")


def run_stage(name: str, out: Path, build: Callable[[Path], dict[str, Any]], *, config: Any,
              inputs: dict[str, str], force: bool = False) -> Path:
    """Run `build(tmp_dir) -> counts` unless `out` is finished; publish atomically; return `out`.

    `config` and `inputs` go into manifest.json with the counts `build` returns and the timings.
    """
    out = Path(out)
    step = "create its lock file"  # what failed, for an EnvironmentFailure
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        with open(out.parent / f".{out.name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # a second run of the same stage waits here, then skips
            if is_done(out) and not force:
                log.info("%s: done already, skipping (%s)", name, out)
                return out
            tmp = out.parent / f".{out.name}.tmp"
            step = "create its temporary directory"
            _remove(tmp)  # left by an interrupted run
            tmp.mkdir()
            started = time.time()
            try:
                step = "build its output"
                counts = build(tmp)
                step = "write its manifest"
                manifest = {"stage": name, "config": config, "inputs": inputs, "counts": counts,
                            "started": started, "seconds": round(time.time() - started, 3),
                            "output": str(out), "files": fingerprint(tmp)}
                _write_text(tmp / MANIFEST, json.dumps(manifest, indent=2, sort_keys=True, default=str))
                step = "publish its output (rename into place)"
                if out.is_dir() and not out.is_symlink():
                    (out / SUCCESS).unlink(missing_ok=True)  # first: an output removed only in part is not trusted
                _remove(out)  # unfinished leftovers, or a finished output being redone under --force
                os.replace(tmp, out)
                step = f"mark its output finished ({SUCCESS})"
                _write_text(out / SUCCESS, "")
            except BaseException:
                _discard(tmp, *([out] if out.exists() and not is_done(out) else []))  # published, not marked
                raise
    except OSError as error:
        failure = environment_failure(error, out.parent, f"stage {name} could not {step}", out)
        if failure is None:
            raise
        raise failure from error
    log.info("%s: finished in %.1f s (%s)", name, time.time() - started, out)
    return out


def write_json(path: Path, value: Any) -> None:
    """Write JSON atomically (temp file + rename)."""
    _write_text(Path(path), json.dumps(value, indent=2, sort_keys=True, default=str))


def write_text(path: Path, text: str) -> None:
    """Write text atomically (temp file + rename)."""
    _write_text(Path(path), text)


def _write_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    except BaseException as error:
        _discard(tmp)  # a half-written file (a full disk) is not left behind
        if isinstance(error, OSError) and error.filename is None and error.errno:  # a failed write names no file
            raise OSError(error.errno, os.strerror(error.errno), str(tmp)) from error
        raise


def _discard(*paths: Path) -> None:
    """Remove what a failed write leaves, as far as the machine lets: the failure being raised is the one to report."""
    for path in paths:
        try:
            _remove(path)
        except OSError as error:
            log.warning("could not remove %s (%s); it is not trusted, and a later run replaces it", path, error)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()
