"""The DAG's beam search over output strings by their exact probability (`dag_beam`), and that probability
(`string_log_likelihood`); the graph's layout as in reder/dag.py."""
import torch

from reder.config import BOS_ID, EOS_ID
from reder.ctc import pad_batch
from reder.dag import dag_greedy, dag_log_likelihood, limit_transitions, target_emissions
from reder.dag_likelihood import NEG_INF


def string_log_likelihood(log_edges: torch.Tensor, log_probs: torch.Tensor, graph_lengths: torch.Tensor,
                          strings: list[list[int]]) -> torch.Tensor:
    """Exact log P(Y|x) (B,) of one string per graph (raw ids, BOS first and EOS last), summed over every path
    that emits it (the loss's DP); −inf where the graph has fewer vertices than the string has tokens."""
    targets, lengths = pad_batch(strings, log_probs.device)
    feasible = graph_lengths.long() >= lengths
    out = torch.full((len(strings),), NEG_INF, dtype=log_probs.dtype, device=log_probs.device)
    if bool(feasible.any()):
        keep = feasible.nonzero()[:, 0]
        emissions = target_emissions(log_probs[keep], targets[keep])
        out[keep] = dag_log_likelihood(log_edges[keep], emissions, graph_lengths[keep], lengths[keep], hand_written=False)
    return out


@torch.no_grad()
def dag_beam(log_edges: torch.Tensor, log_probs: torch.Tensor, graph_lengths: torch.Tensor, beam_size: int,
             top_tokens: int = 5, length_penalty: float = 1.0, excluded: tuple[int, ...] = (),
             max_transition: int = 0) -> list[tuple[list[int], float]]:
    """Beam search over output strings by their exact probability: per graph the string Y = [BOS, y…, EOS]
    maximising log P(Y|x) / |Y|^length_penalty, with log P(Y|x) summed over every path emitting Y (the DP
    of the loss), and its score. Returns raw ids (BOS and EOS kept).

    A hypothesis is a prefix with its forward vector α (log-probability of emitting the prefix on a path
    ending at each vertex), so hypotheses reaching the same prefix along different paths are one hypothesis.
    Each step extends the `beam_size` best prefixes (ranked by their probability, Σ_j exp α_j, excluding the
    last vertex, which has no edge out) by each candidate token: the graph's `top_tokens` most likely
    tokens at some vertex, without BOS and `excluded` (pad, the skip token). Appending EOS at the last
    vertex finishes a hypothesis with its exact log P(Y|x). A graph stops when no live prefix can still
    beat its best finished string: a prefix's probability only falls, and no string is longer than L_b.
    Greedy and lookahead's strings compete too, scored the same way, so the result never scores below them.
    `max_transition` bounds the jumps of every path (`limit_transitions`), the scores' too.
    """
    log_edges = limit_transitions(log_edges, max_transition)
    batch, length, vocab = log_probs.shape
    device, lengths = log_probs.device, graph_lengths.long()
    rows = torch.arange(batch, device=device)
    banned = torch.zeros(vocab, dtype=torch.bool, device=device)
    banned[[BOS_ID, *excluded]] = True
    top = log_probs.masked_fill(banned, NEG_INF).topk(min(top_tokens, vocab), dim=-1).indices  # (B, L, c)
    valid = (torch.arange(length, device=device)[None, :] < lengths[:, None])[..., None].expand_as(top)
    chosen = torch.zeros(batch, vocab, dtype=torch.bool, device=device)
    chosen[rows[:, None, None].expand_as(top)[valid], top[valid]] = True
    chosen[:, EOS_ID] = True
    width = int(chosen.sum(dim=1).max())
    candidates = torch.where(chosen, torch.arange(vocab, device=device), vocab).sort(dim=1).values[:, :width]  # (B, C)
    usable = candidates < vocab
    candidates = candidates.clamp(max=vocab - 1)
    emit = log_probs.gather(2, candidates[:, None, :].expand(batch, length, width))  # (B, L, C)
    emit = emit.masked_fill(~usable[:, None, :], NEG_INF)
    is_eos = candidates == EOS_ID  # (B, C)
    last = lengths - 1
    open_vertex = torch.arange(length, device=device)[None, :] < last[:, None]  # (B, L): vertices with edges out
    alpha = torch.full((batch, beam_size, length), NEG_INF, dtype=log_probs.dtype, device=device)
    alpha[:, 0, 0] = log_probs[:, 0, BOS_ID]
    history = torch.full((batch, beam_size, 1), BOS_ID, dtype=torch.long, device=device)
    best_score = torch.full((batch,), NEG_INF, dtype=log_probs.dtype, device=device)
    best: list[list[int]] = [[] for _ in range(batch)]
    for step in range(1, length):
        reach = torch.logsumexp(alpha[:, :, :, None] + log_edges[:, None], dim=2)  # (B, K, L): paths one edge on
        tokens = step + 1  # |Y| of a string finished now (BOS, step − 1 tokens, EOS)
        eos_at_end = log_probs[rows, last, EOS_ID]
        finished = (reach[rows, :, last] + eos_at_end[:, None]) / tokens**length_penalty  # (B, K)
        top_finished, which = finished.max(dim=1)
        better = top_finished > best_score
        for b in better.nonzero()[:, 0].tolist():
            best[b] = history[b, which[b]].tolist() + [EOS_ID]
        best_score = torch.where(better, top_finished, best_score)
        reach = reach.masked_fill(~open_vertex[:, None, :], NEG_INF)
        extended = torch.logsumexp(reach[..., None] + emit[:, None], dim=2)  # (B, K, C): prefix + token, any vertex
        extended = extended.masked_fill(is_eos[:, None, :], NEG_INF)  # EOS only finishes, at the last vertex
        scores, index = extended.view(batch, -1).topk(beam_size, dim=1)  # (B, K)
        source, token = index // width, index % width
        alpha = reach.gather(1, source[..., None].expand(batch, beam_size, length)) + \
            emit.gather(2, token[:, None, :].expand(batch, length, beam_size)).transpose(1, 2)  # (B, K, L)
        history = torch.cat([history.gather(1, source[..., None].expand(-1, -1, history.shape[2])),
                             candidates.gather(1, token)[..., None]], dim=2)
        hopeful = scores / lengths[:, None].to(scores.dtype) ** length_penalty > best_score[:, None]
        if not bool(hopeful.any()):
            break
        alpha = alpha.masked_fill(~hopeful[..., None], NEG_INF)
    floors = [dag_greedy(log_edges, log_probs, graph_lengths, lookahead) for lookahead in (0.0, 1.0)]  # limited above
    floor_scores = [string_log_likelihood(log_edges, log_probs, graph_lengths, strings).tolist() for strings in floors]
    out = []
    for b in range(batch):
        pool = [(float(best_score[b]), best[b])] if best[b] else []
        pool += [(own[b] / len(strings[b]) ** length_penalty, strings[b]) for strings, own in zip(floors, floor_scores)]
        score, string = max(pool, key=lambda item: item[0])  # max keeps the first of equals: the beam's
        out.append((string, score))
    return out


@torch.no_grad()
def dag_path_beam(log_edges: torch.Tensor, log_probs: torch.Tensor, graph_lengths: torch.Tensor, beam_size: int,
                  top_transitions: int = 5, top_tokens: int = 2, length_penalty: float = 1.0,
                  excluded: tuple[int, ...] = ()) -> list[tuple[list[int], float]]:
    """DA-Transformer's beam search over paths and tokens together (not over strings): a hypothesis is a path
    from vertex 0 with one token per vertex, scored Σ log E(a_{i−1}, a_i) + Σ log P(t_i | v_{a_i}); vertex 0 emits
    BOS. Each step moves every live hypothesis one edge on, to the `top_transitions` most likely next vertices,
    each emitting one of its `top_tokens` most likely tokens (not `excluded`: pad, the skip token), and keeps the
    `beam_size` best; one reaching the last vertex finishes, ranked by score / m^length_penalty, m its vertices
    (Viterbi's rule). Per graph the best finished hypothesis' tokens, consecutive repeats merged (as greedy
    merges them; raw ids, BOS and EOS kept), and its score. K·k·t candidates a step, at most L_b steps: linear in
    the graph, where `dag_beam`'s exact string scores cost a DP over the graph per candidate."""
    batch, length, vocab = log_probs.shape
    device, lengths = log_probs.device, graph_lengths.long()
    banned = torch.zeros(vocab, dtype=torch.bool, device=device)
    banned[[BOS_ID, *excluded]] = True
    token_scores, token_ids = log_probs.masked_fill(banned, NEG_INF).topk(min(top_tokens, vocab), dim=-1)  # (B, L, t)
    moves, tokens = min(top_transitions, length), token_ids.shape[-1]
    vertex = torch.zeros(batch, beam_size, dtype=torch.long, device=device)
    score = torch.full((batch, beam_size), NEG_INF, dtype=log_probs.dtype, device=device)
    score[:, 0] = log_probs[:, 0, BOS_ID]
    parents, emitted = [], [torch.full((batch, beam_size), BOS_ID, dtype=torch.long, device=device)]
    best = torch.full((batch,), NEG_INF, dtype=log_probs.dtype, device=device)
    best_at: list[tuple[int, int, int]] = [(-1, 0, 0)] * batch  # (step, parent slot, token) of each best
    last = (lengths - 1)[:, None, None]
    for step in range(1, length):
        rows = log_edges.gather(1, vertex[..., None].expand(-1, -1, length))  # (B, K, L): edges out of each vertex
        edge, nxt = rows.topk(moves, dim=-1)  # (B, K, k)
        emit = token_scores.gather(1, nxt.view(batch, -1, 1).expand(-1, -1, tokens)).view(batch, beam_size, moves, tokens)
        total = score[..., None, None] + edge[..., None] + emit  # (B, K, k, t)
        ending = (nxt == last)[..., None].expand_as(total)
        finished = torch.where(ending, total, NEG_INF).view(batch, -1).max(dim=1)  # paths of step + 1 vertices
        normalised = finished.values / (step + 1) ** length_penalty
        for b in (normalised > best).nonzero()[:, 0].tolist():
            flat = int(finished.indices[b])
            best_at[b] = (step, flat // (moves * tokens), int(token_ids[b, nxt.view(batch, -1)[b, flat // tokens],
                                                                      flat % tokens]))
        best = torch.maximum(best, normalised)
        live = total.masked_fill(ending, NEG_INF).view(batch, -1)
        score, index = live.topk(beam_size, dim=1)  # (B, K)
        if not bool(torch.isfinite(score).any()):
            break
        parent, move, token = index // (moves * tokens), (index // tokens) % moves, index % tokens
        vertex = nxt.gather(1, parent[..., None].expand(-1, -1, moves)).gather(2, move[..., None])[..., 0]
        parents.append(parent)
        emitted.append(token_ids.gather(1, vertex[..., None].expand(-1, -1, tokens)).gather(2, token[..., None])[..., 0])
    out = []
    for b, (step, slot, token) in enumerate(best_at):
        ids = [token]
        for back in range(step - 1, 0, -1):  # the parent slot at step `back` emitted at that step
            ids.append(int(emitted[back][b, slot]))
            slot = int(parents[back - 1][b, slot])
        ids.append(BOS_ID)
        merged = [t for i, t in enumerate(reversed(ids)) if i == 0 or t != ids[len(ids) - i]]
        out.append((merged, float(best[b])))
    return out
