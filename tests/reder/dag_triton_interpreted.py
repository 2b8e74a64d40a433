"""The Triton DAG DP (reder/dag_triton.py) through Triton's interpreter, against the PyTorch DP (reder/dag.py):
values and gradients on random ragged graphs with λ = 2, 4, 8 and infeasible samples, many random graphs in
float64, gradcheck in float64, the DAG head inside the model with model.dag_dp=triton.

Triton builds a kernel for its interpreter only if TRITON_INTERPRET=1 was set when triton was imported (its
own library functions are kernels too), for the whole process: tests/reder/test_dag_triton.py runs this file
in a pytest process of its own with it set, so that the suite's other tests (torch.compile's kernels, the
compiled kernels on CUDA) never see it. The name keeps the suite from collecting this file itself.
"""
import os

import pytest
import torch

from reder import DuplexLoss, LossConfig
from reder.dag import target_emissions
from reder.objectives import duplex
from reder.objectives.duplex import glance
from reder.objectives.terms import dag_loss

from tests.reder.helpers import dp_differences, random_batch, random_dag_batch, tiny_model

if os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("needs TRITON_INTERPRET=1 from the start of the process: tests/reder/test_dag_triton.py runs it so",
                allow_module_level=True)
pytest.importorskip("triton", reason="Triton is not installed (the optional extra: pip install -e '.[triton]')")
from reder import dag_triton as kernels  # noqa: E402 (imports triton: only after the checks above)


@pytest.mark.parametrize("ratio, block, longest_target", [(2, 16, 10), (4, 16, 10), (8, 16, 10), (8, 64, 10), (4, 16, 32)])
def test_kernels_equal_the_torch_dp_in_float32(ratio, block, longest_target, monkeypatch):
    """Value and gradients within 1e-5 of the PyTorch DP's, relative to their magnitude (log P reaches −60 here,
    and float32 rounds both DPs' log-space sums by ~6e-8 of it); the infeasible sample gives −inf and zeros.
    Tiles of 16 split graphs of up to 64 vertices into up to 4 × 4 tiles; of 64, each graph is one tile.
    Targets of up to 32 tokens on up to 32 vertices take paths that cross tiles at every step."""
    monkeypatch.setattr(kernels, "MAX_BLOCK", block)
    for seed in range(2):
        differences = dp_differences(kernels.triton_dag_log_likelihood, ratio, seed, torch.float32,
                                     longest_target=longest_target)
        assert max(differences) < 1e-5, (seed, differences)


@pytest.mark.parametrize("ratio", [2, 4, 8])
def test_dag_loss_and_its_gradients_with_dp_triton_equal_dp_torch_to_1e_5(ratio):
    """The loss as the head computes it (mean −log P/|Y| over the feasible samples, the infeasible one dropped)."""
    log_edges, log_probs, targets, graph_lengths, target_lengths = random_dag_batch(ratio, seed=10)
    results = {}
    for dp in ("torch", "triton"):
        edges, probs = log_edges.clone().requires_grad_(), log_probs.clone().requires_grad_()
        loss, dropped = dag_loss(edges, probs, graph_lengths, targets, target_lengths, dp=dp)
        loss.backward()
        results[dp] = (loss.detach(), edges.grad, probs.grad, dropped)
    assert int(results["triton"][3]) == 1 and bool(torch.isfinite(results["triton"][0]))
    for got, expected in zip(results["triton"][:3], results["torch"][:3]):
        assert (got - expected).abs().max() < 1e-5
    assert results["triton"][1].abs().max() > 0 and results["triton"][2].abs().max() > 0


def test_kernels_equal_the_torch_dp_in_float64_on_many_random_graphs(monkeypatch):
    """Rounding apart the kernels compute the same sums: float64 agrees to 1e-12 on 9 more random batches (54
    graphs), in tiles of 16."""
    monkeypatch.setattr(kernels, "MAX_BLOCK", 16)
    for ratio in (2, 4, 8):
        for seed in range(100, 103):
            differences = dp_differences(kernels.triton_dag_log_likelihood, ratio, seed, torch.float64, longest=6)
            assert max(differences) < 1e-12, (ratio, seed, differences)


def test_kernels_equal_the_torch_dp_in_float64_on_targets_that_nearly_fill_their_graphs(monkeypatch):
    """Paths that skip at most 3 of up to 40 vertices: the terms at the tiles' edges (vertex 15 at step 15 and
    the like), which carry next to nothing on random graphs, carry much of the probability here. In float64:
    with log P down to −270, both float32 DPs' edge gradients are 1e-5 of their size from the float64 ones."""
    monkeypatch.setattr(kernels, "MAX_BLOCK", 16)
    differences = dp_differences(kernels.triton_dag_log_likelihood, 4, 0, torch.float64, longest=10, slack=3)
    assert max(differences) < 1e-12, differences


def test_kernels_pass_gradcheck_in_float64():
    """Finite differences through the interpreter (feasible samples: log P of the infeasible one is −inf), in
    gradcheck's fast mode: a random projection vᵀJu of each input's Jacobian, numerical against analytical, not the
    Jacobian entry by entry (~400 runs of the interpreted kernels, 22 s on the slow box). The entries are the other
    tests' (every gradient against the PyTorch DP's to 1e-12 in float64, whose own backward passes the full gradcheck
    in tests/reder/test_dag.py)."""
    log_edges, log_probs, targets, graph_lengths, target_lengths = random_dag_batch(1.5, seed=3, dtype=torch.float64,
                                                                                    batch=3, longest=4, longest_target=5)
    feasible = slice(0, 3)
    emissions = target_emissions(log_probs[feasible], targets[feasible]).detach().requires_grad_()
    log_edges = log_edges[feasible].detach().requires_grad_()
    assert torch.autograd.gradcheck(lambda e, m: kernels.triton_dag_log_likelihood(e, m, graph_lengths[feasible],
                                                                                   target_lengths[feasible]),
                                    (log_edges, emissions), fast_mode=True)


def test_the_dag_head_with_dp_triton_trains_as_with_dp_torch_and_glancing_and_fba_are_unchanged(monkeypatch):
    """The whole loss with glancing, FBA and CC on: glancing's draws and FBA's terms are identical (they never
    run the DP), the DP's terms (dag, cc) and every parameter's gradient agree to 1e-5."""
    options = {"head": "dag", "graph_upsample_ratio": 3.0, "link_heads": 2, "dropout": 0.0, "attention_dropout": 0.0}
    loss_config = LossConfig(lambda_fba=0.3, lambda_cc=0.2, glance_start=1.0, glance_end=1.0)
    x, x_lengths = random_batch([5, 3, 4], 12)
    y, y_lengths = random_batch([4, 2, 5], 12)
    runs = {}
    for dp in ("torch", "triton"):
        torch.manual_seed(1)
        model = tiny_model(dag_dp=dp, **options).train()
        model.initialize(x, x_lengths, y, y_lengths)
        glanced = []
        monkeypatch.setattr(duplex, "glance", lambda *args, **kwargs: glanced.append(glance(*args, **kwargs)) or glanced[-1])
        torch.manual_seed(2)
        terms = DuplexLoss(model, loss_config)(x, x_lengths, y, y_lengths, step=0)
        terms["total"].backward()
        runs[dp] = terms, glanced, {name: param.grad for name, param in model.named_parameters()}
    (terms, glanced, grads), (expected_terms, expected_glanced, expected_grads) = runs["triton"], runs["torch"]
    assert len(glanced) == 2 and all(int(chosen.sum()) > 0 for chosen, _ in glanced)
    for (chosen, layout), (expected_chosen, expected_layout) in zip(glanced, expected_glanced):
        assert torch.equal(chosen, expected_chosen) and torch.equal(layout, expected_layout)
    assert set(terms) == set(expected_terms)
    for name, value in terms.items():
        if name.startswith("fba_") or name.startswith("dropped"):
            assert torch.equal(value, expected_terms[name]), name
        else:
            assert abs(float(value.detach() - expected_terms[name].detach())) < 1e-5, name
    assert all(float(terms[f"fba_{d}"].detach()) > 0 for d in ("src2tgt", "tgt2src"))
    for name, grad in grads.items():
        assert grad is not None and (grad - expected_grads[name]).abs().max() < 1e-5, name


def test_the_kernels_are_interpreted_and_refuse_half_precision():
    log_edges, log_probs, targets, graph_lengths, target_lengths = random_dag_batch(2, seed=0)
    emissions = target_emissions(log_probs, targets)
    assert kernels.interpreted()
    with pytest.raises(TypeError, match="float32 or float64 log E and emissions of one dtype"):
        kernels.triton_dag_log_likelihood(log_edges.half(), emissions.half(), graph_lengths, target_lengths)
