"""bench.run_all: JSON collection from benchmark output, skip reasons, the Markdown report."""
from __future__ import annotations

import json

from bench import run_all


def test_parses_one_document_json_lines_and_logs_in_between():
    assert run_all.parse_json_output('{"a": 1}') == {"a": 1}
    assert run_all.parse_json_output('log line\n{"a": 1}\nmore log {not json\n{"b": [2]}\n') == [{"a": 1}, {"b": [2]}]
    assert run_all.parse_json_output("no json at all") is None


def test_missing_inputs_and_missing_scripts_are_reported_as_skipped(tmp_path, capsys):
    out = tmp_path / "report"
    run_all.main(["--only", "train_speed,distill", "--out", str(out)])
    report = json.loads(out.with_suffix(".json").read_text())
    reasons = {name: entry["skipped"] for name, entry in report["benchmarks"].items()}
    assert "needs --workdir" in reasons["train_speed"]
    assert "distill" in reasons and reasons["distill"]
    assert "skipped: needs --workdir" in out.with_suffix(".md").read_text()


def test_markdown_tables_a_summary_list():
    report = {"date": "d", "machine": "m", "benchmarks": {"x": {
        "command": "python -m bench.x", "status": 0, "seconds": 1.0,
        "result": {"summary": [{"depth": 2, "ratio": 1.5}, {"depth": 4, "ratio": 2.5}]}}}}
    text = run_all.markdown(report)
    assert "| depth | ratio |" in text and "| 4 | 2.5 |" in text
