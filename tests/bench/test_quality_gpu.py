"""bench/quality_gpu.sh end to end on a Multi30k slice (CPU, tiny models): teachers and KD, the CTC REDERs
trained at once, the DAG one after them, every saved model timed alone by the speed phase, and the table."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench import quality_table
from tests.bench.conftest import TINY

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_script_trains_scores_and_times_the_four_reders(multi30k_slice, tmp_path):
    out = tmp_path / "out"
    subprocess.run(["bash", str(REPO / "bench" / "quality_gpu.sh"), str(multi30k_slice), str(out), "2",
                    "--validate-every", "1", "--average-best", "2", "--max-tokens", "600", "--warmup", "1", *TINY],
                   cwd=REPO, check=True, env={**os.environ, "PYTHON": sys.executable, "OMP_NUM_THREADS": "1"})
    variants = ("kd", "raw", "kd_noaux", "dag_kd_noaux")
    reports = [out / f"R-{variant}" / "reder.json" for variant in variants]
    for variant, path in zip(variants, reports):
        report = json.loads(path.read_text(encoding="utf-8"))
        assert report["speed_measured"]["by"] == "bench.quality speed" and report["steps"] == 2
        speed = report[variant]["speed"]
        assert {"teacher_beam4_latency_ms", "greedy_latency_ms"} <= set(speed)
        assert ("beam20_rerank_latency_ms" in speed) == (variant == "kd")  # beam 20 + reranking: the paper's setting
        assert (out / f"R-{variant}" / f"model-{variant}").is_dir()
    text = quality_table.main([str(out / "T" / "teachers.json"), *map(str, reports)])
    assert text.count("timed alone by bench.quality speed") == len(variants)
    assert "| REDER-DAG + KD, no FBA/CC | lookahead |" in text
