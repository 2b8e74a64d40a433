"""The DAG loss's DP (reder/dag.py) as Triton kernels: α forward, β and the gradients backward.

Same inputs and value as `dag.dag_log_likelihood` (log E (B, L, L), emissions (B, M, L), graph and target
lengths; −inf where L_b < M_b) and the same closed-form gradients as `dag_likelihood.DagLikelihood`. Layout
(docs/MODEL_NOTES.md, "The Triton DP"): the α and β recursions run one program per sentence, which walks
the target positions in order and, at each, the vertices in blocks, reducing over the other vertex axis
in tiles with an online logsumexp; a barrier between target positions makes a row visible to the whole
program before the next reads it. The edge gradients, a sum over target positions per edge, run one
program per (sentence, tile of edges) with the tile's log E and its gradient kept in registers.

Importing this module imports triton. With TRITON_INTERPRET=1 set before that import the kernels run in
Triton's interpreter (NumPy, CPU tensors): that is how they are tested without a GPU.
"""
import torch
import triton
import triton.language as tl
from torch.autograd.function import once_differentiable

from reder.dag_likelihood import save_likelihood

MAX_BLOCK = 64  # a 64 × 64 float32 tile over 4 warps: 32 registers a thread


def interpreted() -> bool:
    """Whether the kernels were built for Triton's interpreter (TRITON_INTERPRET=1 at import)."""
    return not isinstance(_alpha_kernel, triton.runtime.JITFunction)


def _fix_interpreter_scalars() -> None:
    """Let the interpreter take runtime loop bounds under NumPy >= 2.4 (triton-lang/triton#9171; 3.6.0 has it).

    The interpreter holds a scalar as a NumPy array of shape (1,) and turns it into a Python int, for range(),
    with int(array), which NumPy 2.4 made a TypeError; this converts its one element instead. Compiled kernels
    never run this code."""
    from triton.runtime import interpreter

    original = interpreter._patch_lang_tensor
    if getattr(original, "fixes_scalars", False):
        return

    def patch_lang_tensor(tensor, scope) -> None:
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    patch_lang_tensor.fixes_scalars = True
    interpreter._patch_lang_tensor = patch_lang_tensor


@triton.jit
def _online_logsumexp(peak, total, x, axis: tl.constexpr):
    """Fold one tile x into a running logsumexp along `axis`: (peak, Σ exp(x − peak)), −inf-safe."""
    new_peak = tl.maximum(peak, tl.max(x, axis=axis))
    shift = tl.where(new_peak == float("-inf"), 0.0, new_peak)
    terms = tl.exp(x - tl.expand_dims(shift, axis))
    return new_peak, total * tl.exp(peak - shift) + tl.sum(terms, axis=axis)


@triton.jit
def _logsumexp_value(peak, total):
    """The log of a running logsumexp: −inf where every term was −inf."""
    return tl.where(peak == float("-inf"), float("-inf"), tl.log(tl.where(total > 0, total, 1.0)) + peak)


@triton.jit
def _alpha_kernel(edges, emissions, alpha, graph_lengths, target_lengths,
                  edge_b, edge_k, edge_j, emit_b, emit_i, emit_j, alpha_b, alpha_i, alpha_j,
                  BLOCK_K: tl.constexpr, BLOCK_J: tl.constexpr):
    """One sentence: α_0 = emit_00 at vertex 0; α_i[j] = logsumexp_{k<j} (α_{i−1}[k] + log E_kj) + emit_ij
    for i < M_b, j < L_b (α arrives filled with −inf)."""
    b = tl.program_id(0).to(tl.int64)
    length, steps = tl.load(graph_lengths + b).to(tl.int32), tl.load(target_lengths + b).to(tl.int32)
    edges, emissions, alpha = edges + b * edge_b, emissions + b * emit_b, alpha + b * alpha_b
    dtype = alpha.dtype.element_ty
    tl.store(alpha, tl.load(emissions))
    tl.debug_barrier()
    for i in range(1, tl.where(steps <= length, steps, 1)):  # no path at all (L_b < M_b): α stays −inf
        # A path reaches vertex j at step i only if j ≥ i, from a vertex k ≥ i − 1.
        for j_start in range((i // BLOCK_J) * BLOCK_J, length, BLOCK_J):
            j = j_start + tl.arange(0, BLOCK_J)
            peak, total = tl.full([BLOCK_J], float("-inf"), dtype), tl.zeros([BLOCK_J], dtype)
            for k_start in range(((i - 1) // BLOCK_K) * BLOCK_K, j_start + BLOCK_J, BLOCK_K):
                k = k_start + tl.arange(0, BLOCK_K)
                before = tl.load(alpha + (i - 1) * alpha_i + k * alpha_j, mask=k < length, other=float("-inf"))
                edge = (k[:, None] < j[None, :]) & (j[None, :] < length)
                log_e = tl.load(edges + k[:, None] * edge_k + j[None, :] * edge_j, mask=edge, other=float("-inf"))
                peak, total = _online_logsumexp(peak, total, before[:, None] + log_e, 0)
            emit = tl.load(emissions + i * emit_i + j * emit_j, mask=j < length, other=0.0)
            tl.store(alpha + i * alpha_i + j * alpha_j, _logsumexp_value(peak, total) + emit, mask=j < length)
        tl.debug_barrier()  # row i, written by every thread, is read by every thread at step i + 1


@triton.jit
def _store_beta(beta, grad_emissions, alpha, value, i, k, length, z, scale, beta_i, beta_j, alpha_i, alpha_j):
    """Store β_i[k] and the emission gradient there, exp(α_i[k] + β_i[k] − Z) · scale."""
    inside = k < length
    tl.store(beta + i * beta_i + k * beta_j, value, mask=inside)
    before = tl.load(alpha + i * alpha_i + k * alpha_j, mask=inside, other=float("-inf"))
    tl.store(grad_emissions + i * beta_i + k * beta_j, tl.exp(before + value - z) * scale, mask=inside)


@triton.jit
def _beta_kernel(edges, emissions, alpha, beta, grad_emissions, log_likelihood, grad, graph_lengths, target_lengths,
                 edge_b, edge_k, edge_j, emit_b, emit_i, emit_j, alpha_b, alpha_i, alpha_j, beta_b, beta_i, beta_j,
                 BLOCK_K: tl.constexpr, BLOCK_J: tl.constexpr):
    """One sentence: β_{M_b−1} = 0 at vertex L_b − 1; β_i[k] = logsumexp_{j>k} (log E_kj + emit_{i+1,j} +
    β_{i+1}[j]); and each row's emission gradients. β and grad_emissions (same strides) arrive filled with
    −inf and 0; a sentence without a path (Z = −inf) gets zero gradients."""
    b = tl.program_id(0).to(tl.int64)
    length, steps = tl.load(graph_lengths + b).to(tl.int32), tl.load(target_lengths + b).to(tl.int32)
    edges, emissions, alpha = edges + b * edge_b, emissions + b * emit_b, alpha + b * alpha_b
    beta, grad_emissions = beta + b * beta_b, grad_emissions + b * beta_b
    dtype = beta.dtype.element_ty
    z, upstream = tl.load(log_likelihood + b), tl.load(grad + b)
    feasible = z > float("-inf")
    z, scale = tl.where(feasible, z, 0.0), tl.where(feasible, upstream, 0.0)
    for k_start in range(0, length, BLOCK_K):
        k = k_start + tl.arange(0, BLOCK_K)
        last = tl.where(k == length - 1, 0.0, float("-inf")).to(dtype)
        _store_beta(beta, grad_emissions, alpha, last, steps - 1, k, length, z, scale, beta_i, beta_j, alpha_i, alpha_j)
    tl.debug_barrier()
    for step in range(0, tl.where(feasible, steps - 1, 0)):
        i = steps - 2 - step
        # Only β_i[k] with k ≥ i is ever used: edge k → j at step i needs α_{i−1}[k] finite, so k ≥ i − 1, j ≥ i.
        for k_start in range((i // BLOCK_K) * BLOCK_K, length, BLOCK_K):
            k = k_start + tl.arange(0, BLOCK_K)
            peak, total = tl.full([BLOCK_K], float("-inf"), dtype), tl.zeros([BLOCK_K], dtype)
            for j_start in range((k_start // BLOCK_J) * BLOCK_J, length, BLOCK_J):
                j = j_start + tl.arange(0, BLOCK_J)
                later = j < length
                after = tl.load(emissions + (i + 1) * emit_i + j * emit_j, mask=later, other=float("-inf")) + \
                    tl.load(beta + (i + 1) * beta_i + j * beta_j, mask=later, other=float("-inf"))
                edge = (k[:, None] < j[None, :]) & later[None, :]
                log_e = tl.load(edges + k[:, None] * edge_k + j[None, :] * edge_j, mask=edge, other=float("-inf"))
                peak, total = _online_logsumexp(peak, total, log_e + after[None, :], 1)
            value = _logsumexp_value(peak, total)
            _store_beta(beta, grad_emissions, alpha, value, i, k, length, z, scale, beta_i, beta_j, alpha_i, alpha_j)
        tl.debug_barrier()  # row i is read by every thread at step i − 1


@triton.jit
def _edge_grad_kernel(edges, emissions, alpha, beta, grad_edges, log_likelihood, grad, graph_lengths, target_lengths,
                      edge_b, edge_k, edge_j, emit_b, emit_i, emit_j, alpha_b, alpha_i, alpha_j, beta_b, beta_i, beta_j,
                      BLOCK_K: tl.constexpr, BLOCK_J: tl.constexpr):
    """One tile of one sentence's edges: dZ/d log E_kj = Σ_i exp(α_{i−1}[k] + log E_kj + emit_ij + β_i[j] − Z),
    times the upstream gradient (grad_edges has log E's strides and arrives filled with 0)."""
    b = tl.program_id(0).to(tl.int64)
    k = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    j = tl.program_id(2) * BLOCK_J + tl.arange(0, BLOCK_J)
    length, steps = tl.load(graph_lengths + b).to(tl.int32), tl.load(target_lengths + b).to(tl.int32)
    edges, emissions, alpha, beta = edges + b * edge_b, emissions + b * emit_b, alpha + b * alpha_b, beta + b * beta_b
    z, upstream = tl.load(log_likelihood + b), tl.load(grad + b)
    feasible = z > float("-inf")
    z = tl.where(feasible, z, 0.0)
    first_k, first_j = tl.program_id(1) * BLOCK_K, tl.program_id(2) * BLOCK_J
    if feasible & (first_k < first_j + BLOCK_J - 1) & (first_j < length):  # the tile holds edges of this graph
        edge = (k[:, None] < j[None, :]) & (j[None, :] < length)
        log_e = tl.load(edges + k[:, None] * edge_k + j[None, :] * edge_j, mask=edge, other=float("-inf"))
        total = tl.zeros([BLOCK_K, BLOCK_J], alpha.dtype.element_ty)
        # Edge k → j is step i's only if α_{i−1}[k] is finite, which needs k ≥ i − 1.
        for i in range(1, tl.minimum(steps, first_k + BLOCK_K + 1)):
            before = tl.load(alpha + (i - 1) * alpha_i + k * alpha_j, mask=k < length, other=float("-inf"))
            after = tl.load(emissions + i * emit_i + j * emit_j, mask=j < length, other=float("-inf")) + \
                tl.load(beta + i * beta_i + j * beta_j, mask=j < length, other=float("-inf"))
            total += tl.exp(before[:, None] + log_e + after[None, :] - z)
        inside = (k[:, None] < length) & (j[None, :] < length)
        tl.store(grad_edges + b * edge_b + k[:, None] * edge_k + j[None, :] * edge_j, total * upstream, mask=inside)


if interpreted():
    _fix_interpreter_scalars()


def _blocks(length: int) -> dict[str, int]:
    """Tile sizes: the graph's length rounded up to a power of two, at most MAX_BLOCK, at least 16."""
    block = max(16, min(MAX_BLOCK, triton.next_power_of_2(length)))
    return {"BLOCK_K": block, "BLOCK_J": block}


class TritonDagLikelihood(torch.autograd.Function):
    """log P(Y|X) (B,) by the Triton kernels; saves log E, the emissions, α and log P (as `dag_likelihood.DagLikelihood`),
    and allocates β, the emission gradients and the edge gradients in backward: no (B, L, L) temporary."""

    @staticmethod
    def forward(ctx, log_edges, emissions, graph_lengths, target_lengths):
        batch, steps, length = emissions.shape
        alpha = torch.full((batch, steps, length), float("-inf"), dtype=emissions.dtype, device=emissions.device)
        _alpha_kernel[(batch,)](log_edges, emissions, alpha, graph_lengths, target_lengths, *log_edges.stride(),
                                *emissions.stride(), *alpha.stride(), **_blocks(length))
        return save_likelihood(ctx, log_edges, emissions, alpha, graph_lengths, target_lengths)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        log_edges, emissions, alpha, log_likelihood, graph_lengths, target_lengths = ctx.saved_tensors
        batch, steps, length = emissions.shape
        grad = grad.to(emissions.dtype).contiguous()
        beta = torch.full_like(alpha, float("-inf"))
        grad_emissions, grad_edges = torch.zeros_like(alpha), torch.zeros_like(log_edges)
        common = (log_likelihood, grad, graph_lengths, target_lengths, *log_edges.stride(), *emissions.stride(),
                  *alpha.stride(), *beta.stride())
        blocks = _blocks(length)
        _beta_kernel[(batch,)](log_edges, emissions, alpha, beta, grad_emissions, *common, **blocks)
        tiles = (batch, triton.cdiv(length, blocks["BLOCK_K"]), triton.cdiv(length, blocks["BLOCK_J"]))
        _edge_grad_kernel[tiles](log_edges, emissions, alpha, beta, grad_edges, *common, **blocks)
        return grad_edges, grad_emissions, None, None


def triton_dag_log_likelihood(log_edges: torch.Tensor, emissions: torch.Tensor, graph_lengths: torch.Tensor,
                              target_lengths: torch.Tensor) -> torch.Tensor:
    """`dag.dag_log_likelihood` through the Triton kernels: CUDA tensors, or CPU tensors under the interpreter."""
    if emissions.dtype not in (torch.float32, torch.float64) or log_edges.dtype != emissions.dtype:
        raise TypeError(f"the Triton DAG DP takes float32 or float64 log E and emissions of one dtype, "
                        f"got {log_edges.dtype} and {emissions.dtype}")
    if emissions.device.type == "cpu" and not interpreted():
        raise RuntimeError("the Triton DAG DP got CPU tensors, but its kernels were compiled for a GPU: set "
                           "TRITON_INTERPRET=1 before reder.dag_triton is first imported to run them in Triton's "
                           "interpreter, or use model.dag_dp=torch (or auto) on CPU")
    return TritonDagLikelihood.apply(log_edges, emissions, graph_lengths.long(), target_lengths.long())
