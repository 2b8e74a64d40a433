"""The output heads: registry, saved names (and the older layout's, upgraded on load), upsampling and input limits, the feasibility rules against the
losses they guard, and the heads' loss terms, FBA layouts, CC inputs and decoders inside the model."""
import json
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from reder import BOS_ID, DIRECTIONS, EOS_ID, PAD_ID, DuplexLoss, LossConfig, ModelConfig
from reder.checkpoint import MODEL_FILE, load_model_dir, save_model_dir, upgrade_state_dict
from reder.config import HEADS as CONFIG_HEADS
from reder.dag import dag_greedy, dag_log_likelihood, dag_viterbi, edge_mask, masked_log_softmax, target_emissions, viterbi_align
from reder.dag_beam import dag_beam
from reder.decode import strip_special
from reder.decoding import DECODERS, decoder_names
from reder.decoding.run import choose, decode
from reder import feasibility
from reder.heads import HEADS, CtcHead, DagHead, HeadOutput, head_class, make_head
from tests.reder.helpers import padding_mask, random_batch, tiny_config, tiny_model

_LINK_NAMES = [f"{end}.{name}" for end in ("src", "tgt")
               for name in ("positions.weight", "query.weight", "query.bias", "key.weight", "key.bias", "gate.weight", "gate.bias")]
# The DAG links' entries as the live model names and saves them, and as model directories of the older layout
# (saved before the model stopped renaming its head's parameters) hold them, at the top level.
LINK_KEYS = [f"head.links.{name}" for name in _LINK_NAMES]
OLD_LINK_KEYS = [f"links.{name}" for name in _LINK_NAMES]


def _dag_model(**overrides):
    return tiny_model(**{"head": "dag", "graph_upsample_ratio": 2.5, "link_heads": 2, **overrides})


def _old_layout(state):
    """A current state dict in the older saved layout: the head's links at the top level, order kept."""
    return {name.removeprefix("head.") if name.startswith("head.links.") else name: value for name, value in state.items()}


def test_every_configurable_head_is_registered_with_its_capabilities():
    assert tuple(HEADS) == CONFIG_HEADS
    for name in CONFIG_HEADS:
        head = make_head(tiny_config(head=name, link_heads=2))
        assert type(head) is head_class(name) and head.name == name
        assert decoder_names(name)[0] == "greedy"  # every head has its decoders (reder/decoding/), greedy first
    assert {"greedy", "beam"} <= set(decoder_names("ctc")) & set(decoder_names("dag"))  # both heads search a beam
    assert set(decoder_names("ctc")) | set(decoder_names("dag")) <= set(decoder_names())
    # only the CTC beam's n-best can be reranked (by the teacher or by the model's reverse direction)
    assert ("rerank" in DECODERS["ctc", "beam"].__dataclass_fields__, "rerank" in DECODERS["dag", "beam"].__dataclass_fields__) == (True, False)
    with pytest.raises(ValueError, match="unknown head 'crf'"):
        head_class("crf")


def test_saved_names_are_the_live_ones_and_the_older_layout_loads_through_upgrade_state_dict():
    ctc, dag = tiny_model(), _dag_model()
    live = [name for name, _ in dag.named_parameters()] + [name for name, _ in dag.named_buffers()]
    assert sorted(dag.state_dict()) == sorted(live)  # no renaming when saved
    assert list(dag.state_dict()) == list(ctc.state_dict()) + LINK_KEYS
    assert not any(name.startswith("links.") for name in dag.state_dict())
    current = {name: torch.randn_like(value) if value.is_floating_point() else value for name, value in dag.state_dict().items()}
    old = _old_layout(current)
    assert list(old) == list(ctc.state_dict()) + OLD_LINK_KEYS
    assert list(upgrade_state_dict(old)) == list(current)  # renamed, order kept
    assert upgrade_state_dict(current) == current  # today's layout comes back equal
    restored = _dag_model()
    with pytest.raises(RuntimeError, match='(?s)Missing key.*"head.links.src.positions.weight".*Unexpected key.*"links.src'):
        restored.load_state_dict(old)  # the model itself knows its live names only
    restored.load_state_dict(upgrade_state_dict(old))
    for name, value in current.items():
        assert torch.equal(restored.state_dict()[name], value), name
    assert torch.equal(restored.head.links["src"].query.weight, old["links.src.query.weight"])
    wrapped = DuplexLoss(_dag_model())  # a prefix ("model.") as inside a training wrapper
    wrapped.load_state_dict({f"model.{name}": value for name, value in current.items()})
    assert torch.equal(wrapped.model.head.links["tgt"].gate.bias, current["head.links.tgt.gate.bias"])
    assert list(wrapped.state_dict()) == [f"model.{name}" for name in current]
    assert dag.load_state_dict(ctc.state_dict(), strict=False) == (LINK_KEYS, [])  # (missing, unexpected), live names
    assert ctc.load_state_dict(dag.state_dict(), strict=False) == ([], LINK_KEYS)
    with pytest.raises(RuntimeError, match='Missing key.*"head.links.src.positions.weight"'):
        dag.load_state_dict(ctc.state_dict())


def test_a_model_directory_of_the_older_layout_loads_as_it_was_saved(tmp_path):
    """model.pt rewritten with the older layout's keys (links.* at the top level) loads through load_model_dir
    into the same tensors, and the model decodes as the one saved."""
    torch.manual_seed(0)
    model = _dag_model(dropout=0.0, attention_dropout=0.0)
    src, src_lengths = random_batch([5, 3, 4], 12)
    tgt, tgt_lengths = random_batch([4, 4, 2], 12)
    model.train().initialize(src, src_lengths, tgt, tgt_lengths)  # data-initialised ActNorms
    model.eval()
    spm_file = tmp_path / "fake.model"
    spm_file.write_bytes(b"not read by the model")
    directory = save_model_dir(tmp_path / "model", model, spm_file, "en", "de")
    saved = torch.load(directory / MODEL_FILE, weights_only=True)
    assert OLD_LINK_KEYS[0] not in saved and LINK_KEYS[0] in saved  # saved under the live names
    torch.save(_old_layout(saved), directory / MODEL_FILE)
    assert set(torch.load(directory / MODEL_FILE, weights_only=True)) >= set(OLD_LINK_KEYS)
    loaded, _ = load_model_dir(directory)
    assert list(loaded.state_dict()) == list(model.state_dict())
    for name, value in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], value), name
    for direction in DIRECTIONS:
        for got, expected in zip(loaded(src, src_lengths, direction), model(src, src_lengths, direction)):
            assert torch.equal(got, expected), direction
        assert decode(loaded, src, src_lengths, direction) == decode(model, src, src_lengths, direction)


def test_ctc_upsampling_repeats_every_token_r_times():
    head = CtcHead(tiny_config(upsample_ratio=3))
    tokens, lengths = random_batch([4, 2], 12)
    upsampled, upsampled_lengths = head.upsample(tokens, lengths)
    assert upsampled_lengths.tolist() == [12, 6]
    for b, length in enumerate(lengths.tolist()):
        assert upsampled[b, : 3 * length].tolist() == [t for t in tokens[b, :length].tolist() for _ in range(3)]


@pytest.mark.parametrize("head", ["ctc", "dag"])
def test_max_input_length_is_the_longest_input_that_fits(head):
    for max_positions in (7, 8, 30, 64):
        model = tiny_model(head=head, upsample_ratio=3, graph_upsample_ratio=2.5, link_heads=2, max_positions=max_positions).eval()
        limit = model.max_input_length()
        model(*random_batch([limit], 12), "src2tgt")
        with pytest.raises(ValueError, match="max_positions"):
            model(*random_batch([limit + 1], 12), "src2tgt")


def ctc_loss_is_finite(input_len: int, target: list[int], ratio: int) -> bool:
    """Reference: torch's CTC on T = ratio*(input_len+1) frames for target+EOS (inf when infeasible)."""
    frames = ratio * (input_len + 1)
    labels = torch.tensor(target + [EOS_ID])
    log_probs = torch.randn(frames, 1, 20).log_softmax(-1)
    loss = F.ctc_loss(log_probs, labels[None], torch.tensor([frames]), torch.tensor([len(labels)]),
                      blank=19, reduction="sum", zero_infinity=False)
    return bool(torch.isfinite(loss))


def assert_rule_matches(rule, reference, cases) -> None:
    """rule(input_len, target, ratio) == reference(...) on every case, and the cases reach both answers."""
    outcomes = set()
    for case in cases:
        expected = reference(*case)
        assert rule(*case) == expected, case
        outcomes.add(expected)
    assert outcomes == {True, False}


def test_ctc_feasibility_matches_torch_ctc_loss():
    generator = torch.Generator().manual_seed(0)
    cases = [(0, [], 1), (0, [5], 1), (0, [5, 5], 2), (1, [5, 5, 5], 2), (2, [4, 5, 6, 7, 8], 2),
             (2, [4, 5, 6, 7, 8, 9], 2), (1, [4, 4], 2), (3, [4, 4, 4, 4], 2)]
    for _ in range(200):
        input_len = int(torch.randint(0, 6, (1,), generator=generator))
        target = torch.randint(4, 7, (int(torch.randint(0, 14, (1,), generator=generator)),),
                               generator=generator).tolist()
        cases.append((input_len, target, int(torch.randint(1, 4, (1,), generator=generator))))
    assert_rule_matches(CtcHead.feasible, ctc_loss_is_finite, cases)


def dag_path_exists(input_len: int, target: list[int], ratio: float) -> bool:
    """Reference: the DAG head's own graph for BOS x EOS and its DP for BOS y EOS (−inf without a path)."""
    head = DagHead(ModelConfig(vocab_size=20, d_model=8, n_heads=2, ffn_dim=8, layers_per_end=1, head="dag",
                               graph_upsample_ratio=ratio, link_heads=2, max_positions=256))
    _, graph_lengths = head.upsample(torch.tensor([[4] * input_len + [EOS_ID]]), torch.tensor([input_len + 1]))
    length = int(graph_lengths[0])
    log_edges = masked_log_softmax(torch.randn(1, length, length), edge_mask(graph_lengths, length), dim=-1)
    targets = torch.tensor([[BOS_ID, *target, EOS_ID]])
    emissions = target_emissions(torch.randn(1, length, 20).log_softmax(-1), targets)
    return bool(torch.isfinite(dag_log_likelihood(log_edges, emissions, graph_lengths, torch.tensor([targets.shape[1]]))))


def test_dag_feasibility_matches_the_heads_graph_and_dp():
    generator = torch.Generator().manual_seed(0)
    cases = [(0, [], 1.0), (0, [5], 1.0), (0, [5], 1.5), (3, [5, 5, 5, 5, 5], 1.4), (3, [5] * 5, 1.5), (2, [4] * 30, 8.0)]
    for _ in range(100):
        input_len = int(torch.randint(0, 8, (1,), generator=generator))
        target = [5] * int(torch.randint(0, 20, (1,), generator=generator))
        ratio = round(1 + 3 * float(torch.rand(1, generator=generator)), 2)
        cases.append((input_len, target, ratio))
    assert_rule_matches(DagHead.feasible, dag_path_exists, cases)


def test_feasibility_rules_and_keys_of_a_config():
    ctc, dag = tiny_config(upsample_ratio=3), tiny_config(head="dag", graph_upsample_ratio=1.5, link_heads=2)
    # CTC: 1 piece + EOS → 6 frames; [5, 6, 7, 8] + EOS needs 5, [5, 5, 5, 5] + EOS 5 + 3 blanks
    rule = feasibility.config_rule
    assert rule(ctc)(1, [5, 6, 7, 8]) and not rule(ctc)(1, [5, 5, 5, 5])
    # DAG: BOS + 2 pieces + EOS → int(1.5·4) = 6 vertices for BOS + 4 pieces + EOS, not for 5 pieces
    assert rule(dag)(2, [5, 5, 5, 5]) and not rule(dag)(2, [5, 6, 7, 8, 9])
    assert (feasibility.upsample_ratio(ctc), feasibility.upsample_ratio(dag)) == (3, 1.5)
    # stage directory hashes depend on these keys' bytes: they must never change
    assert json.dumps(feasibility.key(ctc)) == '{"upsample_ratio": 3}'
    assert json.dumps(feasibility.key(dag)) == '{"head": "dag", "graph_upsample_ratio": 1.5}'
    # the torch-free tables are the heads' own: what the pipeline's driver reads is what the model does
    for name, head in HEADS.items():
        assert head.ratio_name == feasibility.RATIO_KEYS[name] and head.emits_blank == feasibility.EMITS_BLANK[name]
    assert set(feasibility.RULES) == set(feasibility.RATIO_KEYS) == set(feasibility.EMITS_BLANK) == set(HEADS)
    with pytest.raises(ValueError, match="unknown head 'rnn'"):
        feasibility.upsample_ratio(SimpleNamespace(head="rnn", upsample_ratio=2))


@pytest.mark.parametrize("ratio", [1.0, 2.0, 2.5, 8.0])
def test_graph_upsampling_copies_tokens_uniformly_between_bos_and_eos_anchors(ratio):
    model = _dag_model(graph_upsample_ratio=ratio, max_positions=128)
    tokens, lengths = random_batch([5, 2, 4], 12)
    graph, graph_lengths = model.head.upsample(tokens, lengths)
    for b, length in enumerate(lengths.tolist()):
        anchored = [BOS_ID] + tokens[b, :length].tolist()  # BOS x… EOS
        vertices = int(ratio * len(anchored))
        assert graph_lengths[b] == vertices and (graph[b, vertices:] == 0).all()
        assert graph[b, :vertices].tolist() == [anchored[j * len(anchored) // vertices] for j in range(vertices)]
        assert graph[b, 0] == BOS_ID and graph[b, vertices - 1] == EOS_ID
        if ratio == int(ratio):  # an integer λ repeats every token λ times, as CTC's upsampling does
            assert graph[b, :vertices].tolist() == torch.tensor(anchored).repeat_interleave(int(ratio)).tolist()
    assert model.max_input_length() == max(n for n in range(200) if int(ratio * (n + 1)) <= 128)


def test_trunk_stays_invertible_and_unchanged_with_the_dag_head():
    ctc = tiny_model(layers_per_end=3).double().eval()
    dag = _dag_model(layers_per_end=3).double().eval()
    missing, unexpected = dag.load_state_dict(ctc.state_dict(), strict=False)
    assert not unexpected and missing == LINK_KEYS  # the live names: head.links.…
    h, mask = torch.randn(3, 7, 16, dtype=torch.float64), padding_mask([7, 5, 2])
    for direction, back in (("src2tgt", "tgt2src"), ("tgt2src", "src2tgt")):
        out = dag.layers(h, mask, direction)
        assert torch.equal(out, ctc.layers(h, mask, direction))
        assert (dag.layers(out, mask, back) - h).abs().max() < 1e-10


def test_dag_loss_terms_gradients_and_dropped_counts():
    model = _dag_model(graph_upsample_ratio=1.0).train()
    src, src_lengths = random_batch([5, 4, 3], 12)
    tgt, tgt_lengths = random_batch([4, 6, 3], 12)  # λ = 1: the second pair cannot fit src2tgt, the first not tgt2src
    terms = DuplexLoss(model, LossConfig(lambda_fba=0.3, lambda_cc=0.2))(src, src_lengths, tgt, tgt_lengths, step=0)
    names = {f"{kind}_{d}" for kind in ("dag", "fba", "cc", "dropped", "dropped_cc") for d in DIRECTIONS} | {"total"}
    assert set(terms) == names
    assert int(terms["dropped_src2tgt"]) == 1 and int(terms["dropped_tgt2src"]) == 1
    expected = sum(terms[f"dag_{d}"] + 0.3 * terms[f"fba_{d}"] + 0.2 * terms[f"cc_{d}"] for d in DIRECTIONS)
    assert torch.allclose(terms["total"], expected) and all(torch.isfinite(v) for v in terms.values())
    terms["total"].backward()
    for name, param in model.named_parameters():
        assert param.grad is not None and torch.isfinite(param.grad).all(), name
    links = model.head.links
    assert links["src"].query.weight.grad.abs().sum() > 0 and links["tgt"].query.weight.grad.abs().sum() > 0


def test_fba_lays_the_target_on_its_viterbi_path():
    model = _dag_model(dropout=0.0, attention_dropout=0.0).double().train()
    src, src_lengths = random_batch([5, 3], 12)
    tgt, tgt_lengths = random_batch([4, 3], 12)
    model.initialize(src, src_lengths, tgt, tgt_lengths)
    output = model.outputs(src, src_lengths, "src2tgt")
    log_probs, log_edges, lengths = output.log_probs, output.extra["log_edges"], output.lengths
    tokens, on_path, feasible = model.head.fba_layout(output, tgt, tgt_lengths)
    targets = torch.cat([torch.full((2, 1), BOS_ID), tgt], dim=1)
    path, _, _ = viterbi_align(log_edges, target_emissions(log_probs, targets), lengths, tgt_lengths + 1)
    assert feasible.all()
    for b in range(2):
        steps, length = int(tgt_lengths[b]) + 1, int(lengths[b])
        vertices = path[b, :steps].tolist()
        assert vertices[0] == 0 and vertices[-1] == length - 1
        assert tokens[b, vertices].tolist() == targets[b, :steps].tolist() and on_path[b].sum() == steps
        others = [j for j in range(length) if j not in vertices]
        assert (tokens[b, others] == model.cfg.blank_id).all() and (tokens[b, length:] == PAD_ID).all()
        assert on_path[b, vertices].all() and not on_path[b, others].any()
    objective = DuplexLoss(model, LossConfig(lambda_fba=1.0, lambda_cc=0.0))
    terms = objective(src, src_lengths, tgt, tgt_lengths, step=0, directions=("src2tgt",))
    assert terms["fba_src2tgt"] > 0
    terms["fba_src2tgt"].backward()
    assert all(p.grad.abs().sum() > 0 for n, p in model.named_parameters() if n.startswith("ends."))


def test_decode_with_every_dag_decoder_in_both_directions_and_clear_errors():
    model = _dag_model().eval()
    tokens, lengths = random_batch([5, 3, 1], 12)
    for direction in DIRECTIONS:
        for decoder in ("greedy", "lookahead", "viterbi"):
            hypotheses = decode(model, tokens, lengths, direction, decoder)
            assert len(hypotheses) == 3 and all(4 <= t < 11 or t == 1 for h in hypotheses for t in h)
    with pytest.raises(ValueError, match=f"^decoder 'mask_predict': a DAG REDER decodes with {', '.join(decoder_names('dag'))}$"):
        decode(model, tokens, lengths, "src2tgt", "mask_predict")
    for direction in DIRECTIONS:  # beam search over strings: the beam's string, specials stripped
        output = model.outputs(tokens, lengths, direction)
        best = dag_beam(output.extra["log_edges"], output.log_probs, output.lengths, 4, excluded=(0, model.cfg.blank_id))
        assert decode(model, tokens, lengths, direction, "beam", beam_size=4) == [strip_special(s, model.cfg.blank_id)
                                                                                 for s, _ in best]
    output = model.outputs(tokens, lengths, "src2tgt")  # the decoding options reach the DAG decoders
    edges, log_probs, graph_lengths = output.extra["log_edges"], output.log_probs, output.lengths
    for decoder, lookahead in (("greedy", 0.0), ("lookahead", 1.0)):
        assert decode(model, tokens, lengths, "src2tgt", decoder, max_transition=2, no_repeat_ngram=2) == [
            strip_special(h, model.cfg.blank_id) for h in dag_greedy(edges, log_probs, graph_lengths, lookahead, 2, 2)]
    assert decode(model, tokens, lengths, "src2tgt", "viterbi", max_transition=2, length_penalty=0.5) == [
        strip_special(h, model.cfg.blank_id) for h in dag_viterbi(edges, log_probs, graph_lengths, 0.5, 2)]
    assert decode(model, tokens, lengths, "src2tgt", "beam", beam_size=3, max_transition=2, length_penalty=0.5) == [
        strip_special(h, model.cfg.blank_id)
        for h, _ in dag_beam(edges, log_probs, graph_lengths, 3, length_penalty=0.5, excluded=(0, model.cfg.blank_id),
                             max_transition=2)]
    # an option the decoder does not take is an error now (the CTC head's, or another DAG decoder's)
    for decoder, options, unknown in (("greedy", {"cutoff_top_n": 3}, "cutoff_top_n"),
                                      ("greedy", {"lookahead_beta": 2.0}, "lookahead_beta"),
                                      ("viterbi", {"no_repeat_ngram": 2}, "no_repeat_ngram"),
                                      ("greedy", {"length_penalty": 0.5}, "length_penalty"),
                                      ("viterbi", {"beam_size": 4}, "beam_size")):
        with pytest.raises(ValueError, match=rf"^decoder '{decoder}' of dag: unknown options \['{unknown}'\]; it takes "):
            decode(model, tokens, lengths, "src2tgt", decoder, **options)
    with pytest.raises(ValueError, match="decoder 'viterbi' with beam 4: a beam search is its own decoder"):
        choose(model, "viterbi", 4)
    with pytest.raises(ValueError, match="^decoder 'viterbi': a CTC REDER decodes with greedy, beam$"):
        decode(tiny_model().eval(), tokens, lengths, "src2tgt", "viterbi")


def test_config_rejects_unknown_heads_and_bad_graph_settings():
    assert tiny_config().head == "ctc" and not hasattr(tiny_model(), "links") and not list(tiny_model().head.parameters())
    cfg = tiny_config(head="dag", graph_upsample_ratio=3.5, link_heads=4)
    assert ModelConfig.from_dict(cfg.to_dict()) == cfg
    for overrides, message in (({"head": "crf"}, r"^head: must be one of \['ctc', 'dag'\], got 'crf'$"),
                               ({"graph_upsample_ratio": 0.5}, r"^graph_upsample_ratio: must be a number >= 1, got 0\.5$"),
                               ({"graph_upsample_ratio": True}, r"^graph_upsample_ratio: .*, got True$"),
                               ({"link_heads": 3}, r"^link_heads: must be a positive divisor of d_model \(\d+\), got 3$"),
                               ({"dag_dp": "cuda"}, r"^dag_dp: must be one of \['auto', 'torch', 'triton'\], got 'cuda'$")):
        with pytest.raises(ValueError, match=message):
            tiny_config(**{"head": "dag", **overrides})


def test_ctc_cycle_input_merges_repeated_frames_and_keeps_blanks_and_fba_lays_out_the_alignment():
    head, frames = CtcHead(tiny_config()), torch.tensor([[4, 4, 11, 11, 5, 3], [6, 11, 6, 3, 0, 0]])  # 11: the blank
    output = HeadOutput(F.one_hot(frames, 12).double().log_softmax(-1), torch.tensor([6, 4]))  # argmax = frames
    tokens, lengths = head.cycle_input(output)
    assert lengths.tolist() == [4, 4] and tokens.tolist() == [[4, 11, 5, 3], [6, 11, 6, 3]]
    layout, compared, feasible = head.fba_layout(output, torch.tensor([[4, 5, 3], [6, 6, 3]]), torch.tensor([3, 3]))
    assert layout.tolist() == frames.tolist() and feasible.all()  # the argmax frames are the best alignment
    assert torch.equal(compared, padding_mask([6, 4]))  # every position is compared


def test_ctc_cycle_input_is_cut_to_what_the_reverse_pass_can_upsample():
    """r·(|x|+1) frames that collapse to more than max_positions / r tokens would be upsampled past
    max_positions by CC's back-translation (a stage-two crash on long sources): CC's input is cut."""
    head = CtcHead(tiny_config(upsample_ratio=2, max_positions=8))
    assert head.max_input_length() == 4
    frames = torch.tensor([[4, 5, 6, 7, 8, 9, 10, 3], [4, 4, 5, 3, 0, 0, 0, 0]])  # no repeats: 8 tokens
    output = HeadOutput(F.one_hot(frames, 12).double().log_softmax(-1), torch.tensor([8, 4]))
    tokens, lengths = head.cycle_input(output)
    assert lengths.tolist() == [4, 3] and tokens.tolist() == [[4, 5, 6, 7], [4, 5, 3, 0]]
    model = tiny_model(upsample_ratio=2, max_positions=8)
    objective = DuplexLoss(model, LossConfig(lambda_fba=0.0, lambda_cc=1.0, aux_start_step=0))
    x = torch.tensor([[4, 5, 6, EOS_ID]])
    model.outputs(tokens[:1], lengths[:1], "tgt2src")  # fits: 4 tokens upsampled to 8 positions
    assert torch.isfinite(objective(x, torch.tensor([4]), x, torch.tensor([4]), step=0)["total"])


def test_dag_cycle_input_is_the_greedy_output_with_eos_cut_to_the_input_limit():
    head = DagHead(tiny_config(head="dag", graph_upsample_ratio=2.0, link_heads=2, max_positions=10))
    assert head.max_input_length() == 4  # BOS + 4 pieces → 10 vertices: CC's input keeps 3 pieces + EOS
    index, graph_lengths = torch.arange(10), torch.tensor([10, 6, 2])
    scores = -5.0 * (index[None, :] - index[:, None] - 1).abs().float()  # (L, L): the next vertex is the likeliest
    log_edges = masked_log_softmax(scores.expand(3, 10, 10), edge_mask(graph_lengths, 10), dim=-1)
    log_probs = (10 * F.one_hot(4 + index % 7, 12).float() + torch.randn(10, 12)).log_softmax(-1).expand(3, 10, 12)
    tokens, lengths = head.cycle_input(HeadOutput(log_probs, graph_lengths, {"log_edges": log_edges}))
    assert lengths.tolist() == [4, 4, 3] and tokens.tolist() == [[4, 5, 6, EOS_ID], [4, 5, 6, EOS_ID], [4, 5, EOS_ID, PAD_ID]]
