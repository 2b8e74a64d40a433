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


def test_the_total_pss_counts_a_page_shared_by_two_processes_once():
    # a process fills 96 MB of shared anonymous memory, then forks and the child reads every page: both map
    # them all (RSS 96 MB each, 192 MB together), their PSS 48 MB each, 96 MB together
    script = ("import mmap, os, time\n"
              "block = mmap.mmap(-1, 96 * 2**20)\n"
              "for _ in range(96): block.write(b'x' * 2**20)\n"
              "pid = os.fork()\n"
              "if not pid: sum(block[i] for i in range(0, len(block), 4096))\n"
              "time.sleep(2.0)\n"
              "if pid: os.waitpid(pid, 0)\n")
    child = subprocess.Popen([sys.executable, "-c", script])
    sampler = data_scale.TreePeak(child.pid, every_s=0.05)
    sampler.start()
    child.wait()
    sampler.done.set()
    sampler.join()
    together = sampler.total_pss()
    rss = sum(peak for peak, _, _, _ in sampler.peaks.values())
    assert together["processes"] == 2 and rss >= 192, (together, sampler.peaks)
    assert 96 <= together["total_pss_mb"] < rss - 60, (together, rss)
    # the shared pages are shared memory's part (Ray's object store is that kind), each process's share named
    assert 90 <= together["parts_mb"]["Pss_Shmem"] <= together["total_pss_mb"], together
    assert all(share["command"].startswith(sys.executable) for share in together["shares"]), together
