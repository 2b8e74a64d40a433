"""bench.confidence: the rank correlations it reports (pipeline.metrics, the evaluate stage's too) against SciPy's
(ties included), the flagging figures (reder.confidence.lowest, the CLI's --flag too) on a set made by hand, and
the bench end to end on a tiny model directory."""
import json

import numpy as np
import pytest

from bench import confidence
from pipeline.metrics import kendall, ranks, spearman
from reder.confidence import lowest


def test_spearman_and_kendall_equal_scipy_with_ties_and_the_textbook_extremes():
    stats = pytest.importorskip("scipy.stats")
    generator = np.random.default_rng(0)
    for _ in range(5):
        a = generator.integers(0, 6, 40).astype(float)  # many ties
        b = a + generator.normal(0, 2, 40)
        b[::7] = b[0]
        assert spearman(a, b) == pytest.approx(stats.spearmanr(a, b).statistic, abs=1e-12)
        assert kendall(a, b) == pytest.approx(stats.kendalltau(a, b).statistic, abs=1e-12)
    rising = np.arange(10.0)
    assert spearman(rising, rising ** 3) == pytest.approx(1.0)
    assert kendall(rising, -rising) == pytest.approx(-1.0)
    with_missing = np.array([-np.inf, 1.0, 2.0, 3.0, -np.inf])  # a score the model could not give ranks lowest
    assert ranks(with_missing).tolist() == [1.5, 3.0, 4.0, 5.0, 1.5]
    quality = np.array([0.0, 1.0, 2.0, 3.0, 0.5])
    assert kendall(with_missing, quality) == pytest.approx(stats.kendalltau(ranks(with_missing), quality).statistic)
    assert np.isfinite(kendall(with_missing, quality)) and np.isfinite(spearman(with_missing, quality))
    assert ranks(np.array([2.0, 1.0, 2.0])).tolist() == [2.5, 1.0, 2.5]


def test_flagging_the_lowest_share_reports_the_flagged_the_kept_and_the_worst_caught():
    quality = np.array([10.0, 80.0, 20.0, 90.0, 70.0, 30.0, 60.0, 95.0, 85.0, 75.0])
    score = np.array([-5.0, -1.0, -0.5, -0.2, -0.3, -4.0, -0.4, -0.1, -0.6, -0.7])  # catches 10 and 30, not 20
    figures = confidence.flagged(score, quality, 30)
    assert figures == {"flagged": 3, "flagged_mean_chrf": round((10 + 30 + 80) / 3, 2),
                       "kept_mean_chrf": round((20 + 90 + 70 + 60 + 95 + 85 + 75) / 7, 2), "worst_caught": 0.667}
    assert confidence.flagged(quality, quality, 30)["worst_caught"] == 1.0  # the oracle catches them all
    assert lowest([0.5, None, -1.0, -1.0, 2.0], 50) == [1, 2]  # None lowest, then the first of equals; round(2.5) = 2
    assert lowest([3.0], 10) == [0] and lowest([], 10) == []
    with pytest.raises(ValueError, match="between 0 and 100"):
        lowest([1.0], 100)


def test_the_bench_scores_both_directions_of_a_model_directory(tiny_model_dir, tmp_path, capsys):
    english = ["the cat sat on the mat", "a dog ran in the park", "the bird sang", "dogs and cats", "the cat"]
    german = ["die katze sass auf der matte", "ein hund lief im park", "der vogel sang", "hunde und katzen", "die katze"]
    (tmp_path / "tiny.en").write_text("".join(line + "\n" for line in english), encoding="utf-8")
    (tmp_path / "tiny.de").write_text("".join(line + "\n" for line in german), encoding="utf-8")
    report = confidence.main(["--model", str(tiny_model_dir), "--data-dir", str(tmp_path), "--test", "tiny",
                              "--flag", "40", "--out", str(tmp_path / "qe.json")])
    assert json.loads((tmp_path / "qe.json").read_text(encoding="utf-8")) == report
    assert list(report["directions"]) == ["en->de", "de->en"]
    for entry in report["directions"].values():
        assert entry["sentences"] == 5 and set(entry["scores"]) == set(confidence.SCORES)
        assert 0 <= entry["defined"] <= 5
        for figures in entry["scores"].values():
            assert figures["flagged"] == 2 and -1 <= figures["kendall"] <= 1 and 0 <= figures["worst_caught"] <= 1
    table = capsys.readouterr().err
    assert "| en->de | round_trip |" in table and "| de->en | dual_xent |" in table
    with pytest.raises(SystemExit, match="tiny.de: line 2: U\\+0000"):
        (tmp_path / "tiny.de").write_text("ok\nbad\x00line\n", encoding="utf-8")
        confidence.main(["--model", str(tiny_model_dir), "--data-dir", str(tmp_path), "--test", "tiny"])
