"""bench.plots: the RESULTS figures drawn from the committed raw files, and a missing input named."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from bench import plots

RESULTS = Path(__file__).resolve().parents[2] / "docs" / "results"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def test_both_figures_are_drawn_from_the_real_files(tmp_path):
    written = plots.main(["--results", str(RESULTS), "--out", str(tmp_path)])
    assert sorted(path.name for path in written) == sorted([plots.BLEU_VS_LATENCY, plots.TRAINING])
    import matplotlib.image

    for path in written:
        assert path.parent == tmp_path and path.read_bytes()[:8] == PNG_SIGNATURE
        assert path.stat().st_size > 20_000  # axes, points, labels: not an empty canvas
        pixels = matplotlib.image.imread(path)
        assert pixels.shape[0] >= 400 and pixels.shape[1] >= 800
        assert pixels[..., :3].std() > 0.05  # something drawn on the white


def test_the_scatter_takes_every_row_with_a_latency_and_nothing_else():
    report = json.loads((RESULTS / plots.QUALITY).read_text())
    points = plots.latency_points(report, RESULTS / plots.QUALITY)
    timed = [row for row in report["rows"] if row["latency_ms"] is not None]
    assert [(p["system"], p["decoder"], p["latency_ms"]) for p in points] == [
        (row["system"], row["decoder"], row["latency_ms"]) for row in timed]
    assert [p["src2tgt"] for p in points] == [row["test_2016_flickr.src2tgt"]["bleu"] for row in timed]
    assert len(points) == 7  # the teachers' greedy and beam 4, two CTC REDERs' greedy, the DAG's three decoders


def test_labels_of_close_points_never_overlap():
    points = [(6.4, 33.8), (6.5, 33.6), (7.5, 34.2), (15.2, 34.0), (40.7, 36.6), (53.1, 37.7)]
    places = plots._label_positions(points, height=0.6)
    for i, (x, y) in enumerate(places):
        assert x > points[i][0]  # right of its point
        for j, (other_x, other_y) in enumerate(places[:i]):
            assert other_x != x or abs(other_y - y) >= 0.6 - 1e-9


@pytest.mark.parametrize("missing", [plots.QUALITY, plots.HISTORY])
def test_a_missing_input_is_an_error_naming_it(tmp_path, capsys, missing):
    results = tmp_path / "results"
    for name in (plots.QUALITY, plots.HISTORY):
        if name != missing:
            (results / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(RESULTS / name, results / name)
    with pytest.raises(SystemExit) as exit_info:
        plots.main(["--results", str(results), "--out", str(tmp_path / "out")])
    assert exit_info.value.code == 2
    error = capsys.readouterr().err
    assert str(results / missing) in error and "missing" in error
    assert not (tmp_path / "out").exists()  # nothing drawn before every input was read


def test_a_report_without_timed_rows_is_an_error_naming_it(tmp_path, capsys):
    results = tmp_path / "results"
    (results / plots.HISTORY).parent.mkdir(parents=True)
    shutil.copy(RESULTS / plots.HISTORY, results / plots.HISTORY)
    report = json.loads((RESULTS / plots.QUALITY).read_text())
    report["rows"] = [{**row, "latency_ms": None} for row in report["rows"]]
    (results / plots.QUALITY).write_text(json.dumps(report))
    with pytest.raises(SystemExit):
        plots.main(["--results", str(results), "--out", str(tmp_path / "out")])
    error = capsys.readouterr().err
    assert str(results / plots.QUALITY) in error and "latency" in error
