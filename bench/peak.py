"""Time and peak memory of a step, shared by the memory benchmarks (bench/memory.py, bench/dag.py).

On CUDA the peak is `max_memory_allocated` above what was allocated before the step; on CPU it is the
process's peak RSS (VmHWM, reset through /proc/self/clear_refs) above its RSS before the step — run such a
measurement in a child process with malloc's mmap threshold pinned (`PINNED_MALLOC`), or freed memory
stays in the heap and later peaks read low.
"""
from __future__ import annotations

import time
from typing import Callable

PINNED_MALLOC = {"MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "0"}


def rss_mb(field: str) -> float:
    """A memory field of /proc/self/status (VmRSS, VmHWM) in MB."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


def time_and_peak(step: Callable[[], None], repeats: int, device: str,
                  reset: Callable[[], None] = lambda: None) -> tuple[list[float], list[float]]:
    """Seconds and peak MB above the start of each of `repeats` calls of `step` (`reset` runs before each,
    untimed)."""
    import torch  # here: the parents that start measuring children never load torch

    times, peaks = [], []
    for _ in range(repeats):
        reset()
        if device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
        else:
            with open("/proc/self/clear_refs", "w") as clear:
                clear.write("5")  # reset VmHWM, the peak RSS
            before = rss_mb("VmRSS")
        start = time.perf_counter()
        step()
        if device == "cuda":
            torch.cuda.synchronize()
            peaks.append((torch.cuda.max_memory_allocated() - before) / 2**20)
        else:
            peaks.append(rss_mb("VmHWM") - before)
        times.append(time.perf_counter() - start)
    return times, peaks
