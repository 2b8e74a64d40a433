"""Benchmarks: `python -m bench.<name>`; see bench/README.md."""
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
MULTI30K = REPO_ROOT.parent / "shared" / "data" / "multi30k"  # the default corpus of every benchmark (../shared/data)
