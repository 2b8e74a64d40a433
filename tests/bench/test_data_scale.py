"""bench.data_scale: the process-tree sampler that finds the largest process of a run."""
from __future__ import annotations

import os
import subprocess
import sys

from bench import data_scale


def test_tree_peak_finds_a_child_and_its_private_memory():
    child = subprocess.Popen([sys.executable, "-c", "import time; block = bytearray(80 * 2**20); time.sleep(1.5)"])
    sampler = data_scale.TreePeak(os.getpid(), every_s=0.05)
    sampler.start()
    child.wait()
    sampler.done.set()
    sampler.join()
    peak, private, shared, _ = sampler.peaks[child.pid]
    assert peak >= 80 and private >= 80 and shared < 80, sampler.peaks[child.pid]
    assert sampler.largest(count=len(sampler.peaks))[0]["peak_rss_mb"] >= peak
