"""Benchmarks: `python -m bench.<name>`; see bench/README.md."""
import socket
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
MULTI30K = REPO_ROOT.parent / "shared" / "data" / "multi30k"  # the default corpus of every benchmark (../shared/data)


def free_port() -> int:
    """A loopback port free right now (bind(0)), for a server a benchmark starts."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def emit(report: dict, out: str | None) -> dict:
    """Print a bench's report as JSON, and write it to `out` (a path, its directory made) when given."""
    import json

    text = json.dumps(report, indent=2)
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(text + "\n", encoding="utf-8")
    print(text)
    return report
