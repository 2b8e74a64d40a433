"""The Triton DAG DP (reder/dag_triton.py): through Triton's interpreter, in two pytest processes of their own
(tests/reder/dag_triton_interpreted.py: against the PyTorch DP, gradcheck, the DAG head with model.dag_dp=triton),
and compiled on CUDA (`gpu`)."""
import inspect
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from reder.dag import resolve_dp

from tests.reder.helpers import dp_differences

triton = pytest.importorskip("triton", reason="Triton is not installed (the optional extra: pip install -e '.[triton]')")

ROOT = Path(__file__).resolve().parents[2]
INTERPRETED = Path(__file__).with_name("dag_triton_interpreted.py")


# The interpreter runs a kernel's programs one by one on one core: its tests run in two child processes at once, split
# so that each takes about half the time (the float64 tests: the many random graphs, the nearly filled graphs and
# gradcheck; the others: float32 at every tile size, the loss, the DAG head in the model).
SHARDS = ("float64", "not float64")


def test_the_kernels_through_the_interpreter_in_processes_of_their_own():
    """TRITON_INTERPRET=1 must be set before triton is imported and holds for the whole process, so the
    interpreter's tests run in child pytests: this session's triton stays compiled. Together the shards run every
    test of the file once."""
    start = time.perf_counter()
    # one torch thread each: the two children have a core each
    env = dict(os.environ, TRITON_INTERPRET="1", OMP_NUM_THREADS="1")
    children = [subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-ra", "-k", shard,
                                  str(INTERPRETED.relative_to(ROOT))], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True) for shard in SHARDS]
    counts = []
    try:
        for shard, child in zip(SHARDS, children):
            stdout, stderr = child.communicate(timeout=900)
            print(f"-k {shard!r}:", stdout[-3000:], stderr[-3000:], sep="\n")
            assert child.returncode == 0, stdout[-6000:] + stderr[-3000:]
            assert "skipped" not in stdout, stdout[-3000:]
            counts.append([int(re.search(rf"(\d+) {word}", stdout).group(1)) for word in ("passed", "deselected")])
    finally:
        for child in children:
            child.kill()
            child.wait()
    print(f"{time.perf_counter() - start:.1f} s")
    (passed, deselected), (passed_too, deselected_too) = counts
    assert passed > 0 and passed_too > 0 and deselected == passed_too and deselected_too == passed  # each test once


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1", reason="this session's triton is the interpreter")
def test_compiled_kernels_refuse_cpu_tensors_with_a_clear_error():
    from reder import dag_triton

    assert not dag_triton.interpreted()
    log_edges, emissions = torch.zeros(1, 3, 3), torch.zeros(1, 2, 3)
    with pytest.raises(RuntimeError, match="set TRITON_INTERPRET=1 before reder.dag_triton is first imported"):
        dag_triton.triton_dag_log_likelihood(log_edges, emissions, torch.tensor([3]), torch.tensor([2]))


def _argument_type(name: str, dtype: str) -> str:
    """Triton's type of a kernel argument of reder/dag_triton.py as `TritonDagLikelihood` passes it."""
    if name.startswith("BLOCK_"):
        return "constexpr"
    if name in ("graph_lengths", "target_lengths"):
        return "*i64"
    if name.split("_")[0] in ("edge", "emit", "alpha", "beta") and "_" in name:  # strides: alpha_i, …
        return "i32"
    return f"*{dtype}"


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1", reason="this session's triton is the interpreter")
@pytest.mark.parametrize("dtype, block", [("fp32", 16), ("fp32", 64), ("fp64", 64)])
def test_the_kernels_compile_for_the_h100_without_a_gpu(dtype, block, tmp_path, monkeypatch):
    """Triton lowers them to PTX and its ptxas to a cubin for sm_90 here: what the interpreter does not check
    (the types of loop-carried values, scalar arithmetic on loaded lengths), and that the barrier between target
    positions is in the α and β kernels (the interpreter runs programs one by one: it never needs one)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from reder import dag_triton

    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    barriers = {dag_triton._alpha_kernel: 2, dag_triton._beta_kernel: 2, dag_triton._edge_grad_kernel: 0}  # first row, loop
    for kernel, count in barriers.items():
        signature = {name: _argument_type(name, dtype) for name in inspect.signature(kernel.fn).parameters}
        source = ASTSource(kernel, signature, constexprs={"BLOCK_K": block, "BLOCK_J": block})
        compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32))
        assert compiled.asm["cubin"] and compiled.asm["ttir"].count("gpu.barrier") == count, kernel


@pytest.mark.gpu
@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, 1e-4), (torch.float64, 1e-12)])
def test_compiled_kernels_equal_the_torch_dp_on_cuda(dtype, tolerance):
    """The compiled kernels (where the barrier between target positions is real) on graphs of up to 320
    vertices (several tiles) and targets of up to 40 tokens; model.dag_dp=auto resolves to them on CUDA.
    In float64 they equal the PyTorch DP to 1e-12 (the same sums); in float32 the two round differently (Triton's
    exp and log are the GPU's approximate instructions): on an H100 (2026-11-26) the edge gradients differed by
    1.4e-5 of their magnitude at λ = 2, so float32's bound is 1e-4 — it still catches a wrong term."""
    from reder import dag_triton

    for ratio in (2, 4, 8):
        for seed in range(4):
            differences = dp_differences(dag_triton.triton_dag_log_likelihood, ratio, seed, dtype, batch=64,
                                               longest=40, longest_target=40, device="cuda")
            assert max(differences) < tolerance, (ratio, seed, differences)
    assert resolve_dp("auto", torch.device("cuda")) == "triton"
