"""What Ray Train has registered of a run, read from its files (tests that signal or kill a training run
once it has a checkpoint to resume from)."""
from __future__ import annotations

import json
from pathlib import Path


def registered_checkpoints(snapshot: Path) -> list[Path]:
    """The checkpoints Ray Train's controller has registered for the run of `snapshot` (its
    checkpoint_manager_snapshot.json); a directory alone is not enough (one reported as a worker dies, or
    the driver is killed, is never registered)."""
    try:
        results = json.loads(snapshot.read_text(encoding="utf-8"))["checkpoint_results"]
    except (OSError, ValueError, KeyError):  # not written yet, or being rewritten
        return []
    return [snapshot.parent / r["checkpoint_dir_name"] for r in results]


def registered_under(root: Path, pattern: str) -> list[Path]:
    """The registered checkpoints of every run whose directory under `root` matches `pattern`."""
    return [c for snapshot in root.glob(f"{pattern}/checkpoint_manager_snapshot.json")
            for c in registered_checkpoints(snapshot)]


def resumed(checkpoint: Path) -> bool:
    """Whether `checkpoint` was saved by a run that resumed (its history has a `resumed_from` entry)."""
    try:
        history = json.loads((checkpoint / "history.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):  # rotated out meanwhile
        return False
    return any("resumed_from" in entry for entry in history)
