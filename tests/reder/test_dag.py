"""The DAG maths (reder/dag.py) against brute force over all paths, plain autograd and gradcheck (float64); a DAG
model learning. The DAG head inside the model: tests/reder/test_heads.py."""
import itertools

import pytest
import torch

from reder import DIRECTIONS, LossConfig, ModelConfig, REDER
from reder.config import BOS_ID, EOS_ID
from reder import dag
from reder.dag import (DagLinks, dag_greedy, dag_log_likelihood, dag_viterbi, edge_mask, masked_log_softmax,
                       limit_transitions, masked_logsumexp, resolve_dp, target_emissions, viterbi_align)
from reder.dag_beam import dag_beam, dag_path_beam, string_log_likelihood

from reder.objectives.terms import dag_loss
from tests.reder.helpers import MULTI30K, WordPairs, memorise

OVERFIT_MAX_STEPS, OVERFIT_LIMIT_S = 80, 150  # ~1 s (stage one) to ~1.5 s (stage two) per update on 2 cores
DAG_AUX_START = 30  # stage two; the DAG head fits these pairs in ~40 updates
CASES = [(9, 6), (7, 3), (5, 5), (2, 2), (8, 4), (6, 2)]  # (graph length L_b, target length M_b)


def _graphs(cases, vocab=5):
    """Random batch: log E (B, L, L) normalised over j > i, log-probs (B, L, V), targets (B, M)."""
    graph_lengths = torch.tensor([length for length, _ in cases])
    target_lengths = torch.tensor([steps for _, steps in cases])
    length, steps = int(graph_lengths.max()), int(target_lengths.max())
    scores = 2 * torch.randn(len(cases), length, length, dtype=torch.float64)
    log_edges = masked_log_softmax(scores, edge_mask(graph_lengths, length), dim=-1)
    log_probs = torch.randn(len(cases), length, vocab, dtype=torch.float64).log_softmax(-1)
    targets = torch.randint(0, vocab, (len(cases), steps))
    return log_edges, log_probs, targets, graph_lengths, target_lengths


def _paths(length, steps):
    """Every vertex sequence 0 = a_1 < … < a_M = L − 1."""
    if steps == 1:
        return [(0,)] if length == 1 else []
    return [(0, *middle, length - 1) for middle in itertools.combinations(range(1, length - 1), steps - 2)]


def _path_scores(log_edges, emissions, length, steps):
    paths = _paths(length, steps)
    scores = [sum(log_edges[a, b] for a, b in zip(path, path[1:])) + sum(emissions[i, v] for i, v in enumerate(path)) for path in paths]
    return paths, torch.stack(scores)


def test_dp_value_and_gradients_equal_brute_force_and_autograd():
    log_edges, log_probs, targets, graph_lengths, target_lengths = _graphs(CASES)
    emissions = target_emissions(log_probs, targets)  # (B, M, L)
    weights = torch.randn(len(CASES), dtype=torch.float64)
    results = {}
    for name in ("hand_written", "autograd", "brute_force"):
        edges, emits = log_edges.detach().requires_grad_(), emissions.detach().requires_grad_()
        if name == "brute_force":
            value = torch.stack([torch.logsumexp(_path_scores(edges[b], emits[b], length, steps)[1], 0)
                                 for b, (length, steps) in enumerate(CASES)])
        else:
            value = dag_log_likelihood(edges, emits, graph_lengths, target_lengths, hand_written=name == "hand_written")
        (value * weights).sum().backward()
        results[name] = (value.detach(), edges.grad, emits.grad)
    for name in ("hand_written", "autograd"):
        for got, expected in zip(results[name], results["brute_force"]):
            assert torch.isfinite(got).all()
            assert (got - expected).abs().max() < 1e-9, name


def test_hand_written_backward_passes_gradcheck():
    log_edges, log_probs, targets, graph_lengths, target_lengths = _graphs([(6, 4), (4, 2), (5, 5)])
    emissions = target_emissions(log_probs, targets).detach().requires_grad_()
    log_edges = log_edges.detach().requires_grad_()
    assert torch.autograd.gradcheck(lambda e, m: dag_log_likelihood(e, m, graph_lengths, target_lengths), (log_edges, emissions))


def test_infeasible_samples_are_dropped_and_counted_without_nan():
    cases = [(6, 4), (3, 5), (4, 2)]  # the middle graph is shorter than its target
    log_edges, log_probs, targets, graph_lengths, target_lengths = _graphs(cases)
    log_edges, log_probs = log_edges.requires_grad_(), log_probs.requires_grad_()
    loss, dropped = dag_loss(log_edges, log_probs, graph_lengths, targets, target_lengths)
    loss.backward()
    assert int(dropped) == 1 and torch.isfinite(loss)
    assert torch.isfinite(log_edges.grad).all() and torch.isfinite(log_probs.grad).all()
    assert log_probs.grad[1].abs().max() == 0  # nothing from the dropped sample
    keep = [0, 2]
    expected, _ = dag_loss(log_edges[keep], log_probs[keep], graph_lengths[keep], targets[keep], target_lengths[keep])
    assert (loss - expected).abs() < 1e-12
    likelihood = dag_log_likelihood(log_edges, target_emissions(log_probs, targets), graph_lengths, target_lengths)
    assert likelihood[1] == float("-inf") and torch.isfinite(likelihood[[0, 2]]).all()


def test_dag_dp_resolves_to_triton_only_on_cuda_and_asking_for_a_missing_triton_is_a_clear_error(monkeypatch):
    """model.dag_dp (the kernels themselves: tests/reder/test_dag_triton.py)."""
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    for installed in (True, False):
        monkeypatch.setattr(dag, "triton_installed", lambda: installed)
        assert resolve_dp("auto", cpu) == "torch" and resolve_dp("torch", cuda) == "torch"
        assert resolve_dp("auto", cuda) == ("triton" if installed else "torch")
    with pytest.raises(RuntimeError, match=r"model.dag_dp=triton but Triton is not installed: pip install -e '.\[triton\]'"):
        resolve_dp("triton", cpu)
    log_edges, log_probs, targets, graph_lengths, target_lengths = _graphs(CASES)
    with pytest.raises(RuntimeError, match="Triton is not installed"):  # raised where the loss runs
        dag_loss(log_edges, log_probs, graph_lengths, targets, target_lengths, dp="triton")
    with pytest.raises(ValueError, match=r"model.dag_dp must be one of \['auto', 'torch', 'triton'\], got 'cuda'"):
        resolve_dp("cuda", cpu)
    monkeypatch.setattr(dag, "triton_installed", lambda: True)
    assert resolve_dp("triton", cpu) == "triton"  # CPU tensors: the interpreter's, or reder.dag_triton's error


def test_viterbi_alignment_equals_brute_force_argmax():
    log_edges, log_probs, targets, graph_lengths, target_lengths = _graphs(CASES + [(3, 4)])
    emissions = target_emissions(log_probs, targets)
    path, feasible, score = viterbi_align(log_edges, emissions, graph_lengths, target_lengths)
    for b, (length, steps) in enumerate(CASES):
        paths, scores = _path_scores(log_edges[b], emissions[b], length, steps)
        assert feasible[b] and abs(score[b] - scores.max()) < 1e-12
        assert path[b, :steps].tolist() == list(paths[int(scores.argmax())]) and (path[b, steps:] == -1).all()
    assert not feasible[-1] and score[-1] == float("-inf") and (path[-1] == -1).all()


def test_links_rows_sum_to_one_over_later_vertices_and_no_nan_with_padding():
    links = DagLinks(d_model=8, n_heads=2, max_positions=16).double()
    graph_lengths = torch.tensor([9, 5, 2, 7])
    states = torch.randn(4, 9, 8, dtype=torch.float64, requires_grad=True)
    log_edges = links(states, graph_lengths)  # (B, L, L)
    assert not torch.isnan(log_edges).any()
    mask = edge_mask(graph_lengths, 9)
    assert (log_edges[~mask] == float("-inf")).all() and torch.isfinite(log_edges[mask]).all()
    for b, length in enumerate(graph_lengths.tolist()):
        sums = log_edges[b, : length - 1].exp().sum(-1)
        assert (sums - 1).abs().max() < 1e-12
    log_probs = torch.randn(4, 9, 6, dtype=torch.float64, requires_grad=True).log_softmax(-1)
    targets = torch.randint(0, 6, (4, 5))
    loss, dropped = dag_loss(log_edges, log_probs, graph_lengths, targets, torch.tensor([5, 3, 2, 5]))
    loss.backward()
    assert int(dropped) == 0 and torch.isfinite(loss)
    grads = [states.grad] + [p.grad for p in links.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    assert states.grad[1, 5:].abs().max() == 0  # padded vertices get nothing


def test_masked_logsumexp_gives_zero_gradients_where_torch_gives_nan():
    x = torch.tensor([[0.5, float("-inf")], [float("-inf"), float("-inf")]], dtype=torch.float64, requires_grad=True)
    torch.logsumexp(x, dim=1)[0].backward()
    assert torch.isnan(x.grad).any()  # the failure mode the masked version exists for
    x.grad = None
    value = masked_logsumexp(x, dim=1)
    value[0].backward()
    assert value[1] == float("-inf") and value[0] == 0.5 and torch.equal(x.grad, torch.tensor([[1.0, 0], [0, 0]], dtype=torch.float64))


def _walk(log_edges, log_probs, length, lookahead):
    """One sentence, plainly: follow argmax_j log E(a, j) + β·max_y log P(y|v_j), emit argmax tokens."""
    vertex, tokens = 0, [int(log_probs[0].argmax())]
    while vertex < length - 1:
        vertex = max(range(vertex + 1, length), key=lambda j: float(log_edges[vertex, j] + lookahead * log_probs[j].max()))
        tokens.append(int(log_probs[vertex].argmax()))
    return [t for i, t in enumerate(tokens) if i == 0 or t != tokens[i - 1]]


@pytest.mark.parametrize("lookahead", [0.0, 1.0])
def test_greedy_and_lookahead_follow_the_argmax_transitions(lookahead):
    log_edges, log_probs, _, graph_lengths, _ = _graphs(CASES, vocab=3)
    hypotheses = dag_greedy(log_edges, log_probs, graph_lengths, lookahead)
    for b, (length, _) in enumerate(CASES):
        assert hypotheses[b] == _walk(log_edges[b], log_probs[b], length, lookahead)


def _blocked_walk(log_edges, log_probs, length, lookahead, max_transition, ngram):
    """One sentence, plainly: greedy/lookahead over the jumps of at most max_transition vertices, skipping a
    vertex whose token would end the (merged) output in a repeated n-gram, 2 ≤ n ≤ ngram, unless all would."""
    vertex, out = 0, [int(log_probs[0].argmax())]
    while vertex < length - 1:
        options = [j for j in range(vertex + 1, length) if j - vertex <= max_transition]
        options.sort(key=lambda j: -float(log_edges[vertex, j] + lookahead * log_probs[j].max()))
        def repeats(tokens):
            return any(tokens[-n:] == tokens[-2 * n : -n] for n in range(2, ngram + 1) if len(tokens) >= 2 * n)
        fine = [j for j in options if int(log_probs[j].argmax()) == out[-1] or not repeats(out + [int(log_probs[j].argmax())])]
        vertex = (fine or options)[0]
        if int(log_probs[vertex].argmax()) != out[-1]:
            out.append(int(log_probs[vertex].argmax()))
    return out


@pytest.mark.parametrize("lookahead", [0.0, 1.0])
def test_transition_limit_and_repeated_ngram_blocking_equal_a_plain_walk(lookahead):
    torch.manual_seed(7)
    cases = [(24, 2), (18, 2), (30, 2), (9, 2)] * 3
    log_edges, log_probs, _, graph_lengths, _ = _graphs(cases, vocab=3)  # 3 tokens: repeats are frequent
    blocked = dag_greedy(log_edges, log_probs, graph_lengths, lookahead, max_transition=4, no_repeat_ngram=3)
    plain = dag_greedy(log_edges, log_probs, graph_lengths, lookahead)
    for b, (length, _) in enumerate(cases):
        assert blocked[b] == _blocked_walk(log_edges[b], log_probs[b], length, lookahead, 4, 3)
        assert plain[b] == _blocked_walk(log_edges[b], log_probs[b], length, lookahead, length, 1)
    assert blocked != plain
    limited = limit_transitions(log_edges, 4)
    for b, (length, _) in enumerate(cases):  # Viterbi and beam under the limit: only paths of short jumps
        for i in range(length):
            assert bool(torch.isinf(limited[b, i, i + 5 :]).all())
        assert torch.equal(limited[b, torch.arange(length - 1), torch.arange(1, length)],
                           log_edges[b, torch.arange(length - 1), torch.arange(1, length)])
    assert dag_viterbi(log_edges, log_probs, graph_lengths, 1.0, max_transition=4) == \
        dag_viterbi(limited, log_probs, graph_lengths, 1.0)


@pytest.mark.parametrize("length_penalty", [0.0, 1.0, 2.0])
def test_viterbi_decoding_equals_brute_force_over_paths_of_every_length(length_penalty):
    log_edges, log_probs, _, graph_lengths, _ = _graphs(CASES, vocab=4)
    hypotheses = dag_viterbi(log_edges, log_probs, graph_lengths, length_penalty)
    best = log_probs.max(-1).values  # (B, L)
    for b, (length, _) in enumerate(CASES):
        candidates = []
        for steps in range(1, length + 1):
            for path in _paths(length, steps):
                score = sum(float(log_edges[b, i, j]) for i, j in zip(path, path[1:])) + sum(float(best[b, v]) for v in path)
                candidates.append((score / steps**length_penalty, path))
        _, path = max(candidates)
        assert hypotheses[b] == [int(log_probs[b, v].argmax()) for v in path]


@pytest.mark.slow
@pytest.mark.timed
@pytest.mark.skipif(not MULTI30K.is_dir(), reason=f"{MULTI30K} is absent")
def test_dag_model_overfits_64_multi30k_pairs_in_both_directions():
    data = WordPairs()  # the last id is the DAG's skip token
    cfg = ModelConfig(vocab_size=data.vocab_size, d_model=128, n_heads=4, ffn_dim=256, layers_per_end=2, dropout=0.0,
                      max_relative_distance=8, head="dag", graph_upsample_ratio=2.0, link_heads=4)
    model = REDER(cfg).train()
    loss_config = LossConfig(lambda_fba=0.1, lambda_cc=0.1, aux_start_step=DAG_AUX_START)
    # score only once the auxiliary stage has run a while
    terms, bleu = memorise(model, loss_config, data, every=10, score_from=DAG_AUX_START + 10, limit_s=OVERFIT_LIMIT_S,
                           max_steps=OVERFIT_MAX_STEPS)
    scores = {d: bleu(d, "greedy") for d in DIRECTIONS}
    assert terms["fba_src2tgt"] > 0 and terms["cc_tgt2src"] > 0  # the auxiliary stage ran
    assert terms["dropped_src2tgt"] == 0 and terms["dropped_tgt2src"] == 0
    assert min(scores.values()) > 90, scores
    others = {(d, decoder): bleu(d, decoder) for d in DIRECTIONS for decoder in ("lookahead", "viterbi")}
    print(others)
    assert min(others.values()) > 80, others


def _anchored(log_probs, graph_lengths, skip):
    """As a trained graph: BOS likely at vertex 0, EOS at the last vertex, the skip token unlikely."""
    logits = log_probs.clone()
    logits[:, 0, BOS_ID] += 3.0
    logits[torch.arange(len(graph_lengths)), graph_lengths - 1, EOS_ID] += 3.0
    logits[..., skip] -= 3.0
    return logits.log_softmax(-1)


def _best_string(log_edges, log_probs, length, length_penalty, tokens):
    """Brute force: the string [BOS, y…, EOS] (y over `tokens`) of the highest exact normalised probability."""
    best = None
    for size in range(0, length - 1):
        for middle in itertools.product(tokens, repeat=size):
            string = [BOS_ID, *middle, EOS_ID]
            score = float(string_log_likelihood(log_edges[None], log_probs[None], torch.tensor([length]), [string])[0])
            if best is None or score / len(string) ** length_penalty > best[0]:
                best = (score / len(string) ** length_penalty, string)
    return best


@pytest.mark.parametrize("length_penalty", [0.0, 1.0])
def test_dag_beam_with_a_wide_beam_finds_the_most_probable_string_by_brute_force(length_penalty):
    """Exact string probabilities: string_log_likelihood equals the sum over paths; a beam wide enough to keep
    every prefix finds the brute-force best string, with its score."""
    torch.manual_seed(4)
    cases, vocab, skip = [(6, 2), (5, 2), (4, 2), (2, 2)], 6, 5
    log_edges, log_probs, _, graph_lengths, _ = _graphs(cases, vocab)
    log_probs = _anchored(log_probs, graph_lengths, skip)
    string = [BOS_ID, 4, 1, EOS_ID]
    emissions = target_emissions(log_probs[:1], torch.tensor([string]))[0]
    _, by_path = _path_scores(log_edges[0], emissions, 6, 4)
    assert torch.allclose(string_log_likelihood(log_edges[:1], log_probs[:1], graph_lengths[:1], [string])[0],
                          torch.logsumexp(by_path, 0))
    results = dag_beam(log_edges, log_probs, graph_lengths, beam_size=27, top_tokens=vocab,
                       length_penalty=length_penalty, excluded=(0, skip))
    floors = [dag_greedy(log_edges, log_probs, graph_lengths, lookahead) for lookahead in (0.0, 1.0)]
    for b, (length, _) in enumerate(cases):
        pool = [_best_string(log_edges[b], log_probs[b], length, length_penalty, (1, 4))]
        for strings in floors:  # greedy and lookahead compete (on random graphs not always BOS … EOS strings)
            exact = string_log_likelihood(log_edges[b : b + 1], log_probs[b : b + 1], graph_lengths[b : b + 1], [strings[b]])
            pool.append((float(exact[0]) / len(strings[b]) ** length_penalty, strings[b]))
        score, string = max(pool, key=lambda item: item[0])
        assert results[b][0] == string and results[b][1] == pytest.approx(score, abs=1e-9)
    assert sum(result[0][0] == BOS_ID and result[0][-1] == EOS_ID and len(result[0]) > 2 for result in results) >= 2


def test_dag_beam_never_scores_below_greedy_and_lookahead():
    """On the model score (exact normalised string probability), whatever the beam size; the reported score is
    the string's own."""
    torch.manual_seed(5)
    cases = [(12, 2), (9, 2), (15, 2), (7, 2), (10, 2)] * 4
    log_edges, log_probs, _, graph_lengths, _ = _graphs(cases, vocab=7)
    log_probs = _anchored(log_probs, graph_lengths, 6)
    floors = [dag_greedy(log_edges, log_probs, graph_lengths, lookahead) for lookahead in (0.0, 1.0)]
    floor_scores = [string_log_likelihood(log_edges, log_probs, graph_lengths, strings) / torch.tensor(
        [len(s) for s in strings]) for strings in floors]
    wins = 0
    for beam_size in (1, 2, 4):
        results = dag_beam(log_edges, log_probs, graph_lengths, beam_size, top_tokens=3, excluded=(0, 6))
        own = string_log_likelihood(log_edges, log_probs, graph_lengths, [string for string, _ in results])
        for b, (string, score) in enumerate(results):
            assert score == pytest.approx(float(own[b]) / len(string), abs=1e-9)
            assert all(score >= float(floor[b]) - 1e-9 for floor in floor_scores)
        wins += sum(score > max(float(floor[b]) for floor in floor_scores) + 1e-6 for b, (_, score) in enumerate(results))
    assert wins > 10  # the beam finds strings above both, not only theirs


@pytest.mark.parametrize("length_penalty", [0.0, 1.0])
def test_dag_path_beam_with_a_wide_beam_finds_the_best_path_and_tokens_by_brute_force(length_penalty):
    """Every path from vertex 0 to the last with every choice of a usable token per vertex (BOS at vertex 0),
    scored Σ log E + Σ log P(token | vertex) over m^length_penalty: an unbounded path beam returns the best one's
    score and its tokens with consecutive repeats merged."""
    torch.manual_seed(6)
    lengths, vocab, excluded = torch.tensor([6, 5, 4, 2]), 6, (0, 5)
    width = int(lengths.max())
    log_edges = masked_log_softmax(torch.randn(4, width, width, dtype=torch.float64), edge_mask(lengths, width), -1)
    log_probs = torch.randn(4, width, vocab, dtype=torch.float64).log_softmax(-1)
    results = dag_path_beam(log_edges, log_probs, lengths, beam_size=10_000, top_transitions=width, top_tokens=vocab,
                            length_penalty=length_penalty, excluded=excluded)
    usable = [t for t in range(vocab) if t not in (*excluded, BOS_ID)]
    for b, length in enumerate(lengths.tolist()):
        best = None
        for inner in range(length - 1):
            for middle in itertools.combinations(range(1, length - 1), inner):
                path = (0, *middle, length - 1)
                edges = sum(float(log_edges[b, u, v]) for u, v in zip(path, path[1:]))
                for tokens in itertools.product(usable, repeat=len(path) - 1):
                    score = edges + float(log_probs[b, 0, BOS_ID]) + sum(float(log_probs[b, v, t]) for v, t in zip(path[1:], tokens))
                    score /= len(path) ** length_penalty
                    if best is None or score > best[0]:
                        best = (score, [BOS_ID, *tokens])
        merged = [t for i, t in enumerate(best[1]) if i == 0 or t != best[1][i - 1]]
        assert results[b] == (merged, pytest.approx(best[0], abs=1e-9))


def test_dag_path_beam_keeps_its_beam_and_candidates_and_a_narrow_beam_scores_no_higher():
    torch.manual_seed(7)
    lengths = torch.tensor([14, 9, 11])
    log_edges = masked_log_softmax(torch.randn(3, 14, 14, dtype=torch.float64), edge_mask(lengths, 14), -1)
    log_probs = torch.randn(3, 14, 9, dtype=torch.float64).log_softmax(-1)
    wide = dag_path_beam(log_edges, log_probs, lengths, 64, 14, 9, excluded=(0, 8))
    for beam_size, moves, tokens in ((1, 1, 1), (2, 3, 1), (4, 5, 2)):
        narrow = dag_path_beam(log_edges, log_probs, lengths, beam_size, moves, tokens, excluded=(0, 8))
        for (ids, score), (_, best) in zip(narrow, wide):
            assert score <= best + 1e-12 and ids[0] == BOS_ID and not set(ids) & {0, 8}
    # beam 1, one move, one token: at each vertex the single best edge out, the vertex's best token
    greedy_like = dag_path_beam(log_edges, log_probs, lengths, 1, 1, 1, excluded=(0, 8))
    for b, length in enumerate(lengths.tolist()):
        vertex, ids, score, vertices = 0, [BOS_ID], float(log_probs[b, 0, BOS_ID]), 1
        while vertex != length - 1:
            edge, vertex = log_edges[b, vertex].max(dim=0)
            token_scores = log_probs[b, int(vertex)].clone()
            token_scores[[0, 8, BOS_ID]] = float("-inf")
            best_token, token = token_scores.max(dim=0)
            score, vertex, vertices = score + float(edge) + float(best_token), int(vertex), vertices + 1
            ids += [] if int(token) == ids[-1] else [int(token)]
        assert greedy_like[b] == (ids, pytest.approx(score / vertices, abs=1e-12))
