"""bench.quality's teachers and reder phases with --validate-every: the published models are the average of
the best checkpoints by validation BLEU, as the pipeline's train stage publishes them."""
import pytest

from bench import quality
from tests.bench.conftest import TINY


def _check_averaged(entry: dict, steps: int, keep: int) -> None:
    averaged = entry["averaged"]
    assert len(averaged) == keep and {a["step"] for a in averaged} <= set(range(1, steps + 1))
    assert [a["valid_bleu"] for a in averaged] == sorted((a["valid_bleu"] for a in averaged), reverse=True)
    assert entry["validation_seconds"] > 0


@pytest.mark.slow
def test_validated_runs_publish_the_average_of_their_best_checkpoints(multi30k_slice, tmp_path):
    common = ["--data-dir", str(multi30k_slice), "--max-tokens", "600", "--warmup", "1", "--steps", "3",
              "--validate-every", "1", "--average-best", "2", *TINY]
    teachers = quality.main(["teachers", "--out", str(tmp_path / "T"), *common])
    assert teachers["validate_every"] == 1 and teachers["average_best"] == 2
    for direction in ("src2tgt", "tgt2src"):
        _check_averaged(teachers[f"train_{direction}"], 3, 2)
        assert set(teachers[f"train_{direction}"]["last_update_greedy"]) == {f"{t}.{direction}" for t in quality.TESTS}
    reder = quality.main(["reder", "--from", str(tmp_path / "T"), "--out", str(tmp_path / "R"), *common,
                          "--variants", "kd_noaux"])
    _check_averaged(reder["kd_noaux"], 3, 2)
    assert set(reder["kd_noaux"]["last_update_greedy"]) == set(reder["kd_noaux"]["greedy"])
    with pytest.raises(ValueError, match="not supported"):
        quality.main(["aux", "--from", str(tmp_path / "T"), "--out", str(tmp_path / "A"), *common])
