"""The autoregressive teacher as a CTranslate2 model: conversion, and decoding that mirrors the teacher's `greedy`
and `beam` decoders (reder/decoding/autoregressive.py).

CTranslate2 is an optional extra (`pip install -e .[ct2]`); it is imported inside the functions only.

Conversion fills CTranslate2's `TransformerSpec` (pre-norm, ReLU, final LayerNorm on each stack) from the state
dict: self-attention q/k/v fused into one projection and cross-attention k/v into another, as CTranslate2 lays
them out; the one token embedding goes to the encoder, the decoder and the output projection (`optimize`
stores it once, as aliases); embeddings scaled by √D; our `sinusoids` table given as the position encodings, row 0 for
the first token (fairseq's own table starts at padding_idx + 1; ours does not, so no rows are skipped).

Vocabulary: CTranslate2 reads and writes token strings. We register the SentencePiece pieces of the model
directory's `spm.model`: ids 0–3 are `<pad>`, `<unk>`, `<s>`, `</s>`, so CTranslate2's default unk/bos/eos
names fit, and the last is the CTC blank `<blank>` (a control piece `pipeline.stages.spm` appends). So the model
is usable with plain CTranslate2 on `sp.encode(text, out_type=str)`, and `translate_ids` maps ids to pieces
and back through the same list: ids in, ids out, exactly ours.

Decoding (`translate_ids`) mirrors ours: the source is the ids with their EOS (`add_source_eos` off), the decoder
starts from BOS; pad, BOS and the blank are suppressed (`suppress_sequences`); unk stays allowed (ours allows
it). Scores: both rank extensions by summed log-probability (the top 2K of K beams, EOS in the top K finishing,
the first K others going on; one live beam at step 0) and finish with sum / len**length_penalty; CTranslate2
counts EOS in len only when it returns it, so `return_end_token` is on and EOS stripped here.
Limits: ours is per sentence, int(a·|x| + b) tokens with EOS, EOS forced on the last; CTranslate2's
`max_decoding_length` is one number per call and its last step ends every beam *without* EOS. So a batch runs
to its longest limit; a sentence whose search went on past the point where its own limit would have cut it is
decoded again to its own limit (`max_decoding_length = limit − 1`), a greedy path past it is truncated, and a
hypothesis cut at the limit gets EOS and its log-probability (`score_batch`), as ours. Beam search (K > 1): ours runs a greedy row beside the beams,
whose hypothesis joins the finished ones; here CTranslate2's greedy result competes likewise (`greedy_floor`).

What still differs, beam search only:
- The banned tokens' mass. `suppress_sequences` takes pad, BOS and the blank out of the logits *before*
  CTranslate2's softmax, which renormalises the other tokens; ours sets their log-probabilities to −inf after
  it (as fairseq). A step's scores then differ by log(1 − the banned tokens' probability), which differs from
  beam to beam, so beams can rank differently (greedy cannot: the argmax is the same). A trained model puts
  next to nothing on those tokens; the barely trained model of tests/reder/test_ct2.py puts 0.1–2 % per step
  (CTranslate2's greedy log-probabilities 0.001–0.025 nats above ours), and 10–14 of its 60 beam-4 outputs
  differ, 0–2 of them scoring lower in ours, by the threads it was trained with.
- The stopping rule. CTranslate2 (with a length penalty) stops a sentence once K·patience hypotheses have
  finished; ours once K have finished *and* the best live beam, ended now, would not beat the K-th best.
  Scored CTranslate2's way (the test runs ours so), the beams evolve identically until one stops, and ours
  never stops first at patience 1, so ours has finished every hypothesis CTranslate2 has: where the outputs
  differ, ours finished after CTranslate2 stopped and scores higher (CTranslate2's answer is then an earlier
  beam hypothesis, or the greedy one where that beat it).

Measured on 250 Multi30k sentences with a small trained teacher, as it is: greedy 250/250 identical, beam 4
242/250 (every difference of the stopping kind: each of our 8 outputs is among CTranslate2's finished hypotheses
when it runs on, at patience 8); at patience 2 244/250, but then CTranslate2 also finds hypotheses ours never
reaches (4 of the 6 differences score higher than ours). With length_penalty 0, CTranslate2 stops once its top
beam and num_hypotheses (here K) have finished.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from reder.autoregressive import Transformer, output_limits, sinusoids
from reder.checkpoint import SPM_FILE, load_model_dir
from reder.config import BOS_ID, EOS_ID, PAD_ID

VOCABULARY_FILE = "shared_vocabulary.json"  # CTranslate2's name for a vocabulary shared by source and target


def vocabulary(spm_model: Path, vocab_size: int) -> list[str]:
    """The token strings of ids 0 … vocab_size−1: the pieces of the run's SentencePiece model, whose last piece
    is already the CTC blank (`pipeline.stages.spm` appends it as a control piece)."""
    import sentencepiece

    processor = sentencepiece.SentencePieceProcessor(model_file=str(spm_model))
    pieces = [processor.id_to_piece(i) for i in range(processor.get_piece_size())]
    if len(pieces) != vocab_size or pieces[: EOS_ID + 1] != ["<pad>", "<unk>", "<s>", "</s>"] or len(set(pieces)) != len(pieces):
        raise ValueError(f"{spm_model}: expected {vocab_size} distinct pieces starting <pad> <unk> <s> </s> (the "
                         f"model's vocabulary), got {len(pieces)} starting {pieces[:4]}")
    return pieces


def _numpy(tensor: torch.Tensor) -> Any:
    return tensor.detach().to(torch.float32).cpu().contiguous().numpy()


def _linear(spec: Any, *modules: torch.nn.Linear) -> None:
    """One CTranslate2 linear from our linears stacked along the output dimension (fused q/k/v or k/v)."""
    spec.weight = _numpy(torch.cat([m.weight for m in modules], dim=0))  # (out, in)
    spec.bias = _numpy(torch.cat([m.bias for m in modules], dim=0))


def _layer_norm(spec: Any, module: torch.nn.LayerNorm) -> None:
    spec.gamma, spec.beta = _numpy(module.weight), _numpy(module.bias)


def _attention(spec: Any, module: Any, self_attention: bool) -> None:
    if self_attention:
        _linear(spec.linear[0], module.query, module.key, module.value)
    else:
        _linear(spec.linear[0], module.query)
        _linear(spec.linear[1], module.key, module.value)
    _linear(spec.linear[-1], module.out)


def _ffn(spec: Any, norm: torch.nn.LayerNorm, ffn: torch.nn.Sequential) -> None:
    _layer_norm(spec.layer_norm, norm)
    _linear(spec.linear_0, ffn[0])
    _linear(spec.linear_1, ffn[2])


def model_spec(model: Transformer, pieces: list[str]) -> Any:
    """CTranslate2's TransformerSpec for our Transformer, weights set and validated."""
    from ctranslate2.specs import common_spec, transformer_spec

    cfg = model.cfg
    spec = transformer_spec.TransformerSpec.from_config((cfg.encoder_layers, cfg.decoder_layers), cfg.n_heads,
                                                        pre_norm=True, activation=common_spec.Activation.RELU)
    positions = _numpy(sinusoids(cfg.max_positions, cfg.d_model))  # (L, D), the same table as ours
    embedding = _numpy(model.embed.weight)  # (V, D)
    for stack in (spec.encoder, spec.decoder):
        embeddings = stack.embeddings[0] if isinstance(stack.embeddings, list) else stack.embeddings
        embeddings.weight, stack.scale_embeddings = embedding, True  # × √D
        stack.position_encodings.encodings = positions
    _layer_norm(spec.encoder.layer_norm, model.encoder_norm)
    for layer_spec, layer in zip(spec.encoder.layer, model.encoder):
        _attention(layer_spec.self_attention, layer.attention, self_attention=True)
        _layer_norm(layer_spec.self_attention.layer_norm, layer.attention_norm)
        _ffn(layer_spec.ffn, layer.ffn_norm, layer.ffn)
    _layer_norm(spec.decoder.layer_norm, model.decoder_norm)
    spec.decoder.projection.weight = embedding  # tied output projection, no bias
    for layer_spec, layer in zip(spec.decoder.layer, model.decoder):
        _attention(layer_spec.self_attention, layer.self_attention, self_attention=True)
        _layer_norm(layer_spec.self_attention.layer_norm, layer.self_norm)
        _attention(layer_spec.attention, layer.cross_attention, self_attention=False)
        _layer_norm(layer_spec.attention.layer_norm, layer.cross_norm)
        _ffn(layer_spec.ffn, layer.ffn_norm, layer.ffn)
    spec.register_source_vocabulary(pieces)
    spec.register_target_vocabulary(pieces)
    spec.config.layer_norm_epsilon = model.encoder_norm.eps  # torch's 1e-5, stated rather than assumed
    spec.config.add_source_eos = False  # our sources already end in EOS
    spec.config.decoder_start_token = pieces[BOS_ID]
    spec.validate()
    return spec


def convert_model(model: Transformer, spm_model: Path, out_dir: Path, quantization: str | None = None) -> Path:
    """Write our Transformer as a CTranslate2 model directory; returns it. Weights float32 unless `quantization`
    (CTranslate2's: "int8", "float16", …; outputs then no longer match ours exactly)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    spec = model_spec(model, vocabulary(spm_model, model.cfg.vocab_size))  # float32 CPU copies of the weights
    spec.optimize(quantization)  # stores the shared embedding and position table once (aliases)
    spec.save(str(out_dir))
    (out_dir / "reder.json").write_text(json.dumps({"max_positions": model.cfg.max_positions}), encoding="utf-8")
    return out_dir


def convert(teacher_dir: Path, out_dir: Path, quantization: str | None = None) -> Path:
    """Convert a teacher model directory (`reder.checkpoint`, architecture "transformer") to CTranslate2."""
    model, meta = load_model_dir(teacher_dir)
    if not isinstance(model, Transformer):
        raise ValueError(f"{teacher_dir}: architecture {meta.get('architecture', 'reder')!r} is not an "
                         "autoregressive Transformer; only teachers convert to CTranslate2")
    return convert_model(model, Path(teacher_dir) / SPM_FILE, out_dir, quantization)


def load_translator(ct2_dir: Path, device: str = "cpu", threads: int = 1, compute_type: str = "default") -> Any:
    """A `ctranslate2.Translator` over a converted directory (one worker, `threads` threads per worker;
    `compute_type` CTranslate2's: "default" keeps the converted float32, "int8" quantizes the weights)."""
    import ctranslate2

    return ctranslate2.Translator(str(ct2_dir), device=device, inter_threads=1, intra_threads=threads,
                                  compute_type=compute_type)


def _pieces_of(ct2_dir: Path) -> list[str]:
    return json.loads((Path(ct2_dir) / VOCABULARY_FILE).read_text(encoding="utf-8"))


Candidates = list[tuple[list[str], float]]  # one sentence's hypotheses (pieces, EOS last unless cut) and scores


def translate_ids(translator: Any, ct2_dir: Path, sequences: list[list[int]], beam_size: int = 4,
                  length_penalty: float = 1.0, max_len_a: float = 1.2, max_len_b: int = 10,
                  greedy_floor: bool = True, patience: float = 1.0, batch_size: int = 64) -> list[list[int]]:
    """Token ids (each ending in EOS) → one hypothesis per sentence (ids without specials), as
    the teacher's own greedy or beam search with the same arguments (see the module doc for what differs).

    Length-sorted batches of `batch_size` run to their longest limit; a sentence's beam result is exactly what a
    run to its own limit L gives when its search stopped before step L − 2 (its longest finished hypothesis,
    one of the K returned, is shorter than L − 1 with EOS); the others are decoded again, grouped by limit. A
    greedy hypothesis past the limit is cut there. Cut hypotheses get the EOS ours forces (`score_batch`). With
    beam_size > 1 and `greedy_floor` the greedy hypothesis competes too (our beam search runs a greedy row beside
    the beams; CTranslate2 has no option for it)."""
    pieces = _pieces_of(ct2_dir)
    max_positions = json.loads((Path(ct2_dir) / "reder.json").read_text(encoding="utf-8"))["max_positions"]
    for number, sequence in enumerate(sequences, start=1):
        if not sequence or sequence[-1] != EOS_ID or len(sequence) > max_positions:
            raise ValueError(f"input {number}: expected 1 to {max_positions} ids ending in EOS ({EOS_ID}), got {len(sequence)} ids")
    limits = output_limits([len(s) for s in sequences], max_len_a, max_len_b, max_positions)
    sources = [[pieces[t] for t in s] for s in sequences]
    options = dict(max_batch_size=0, length_penalty=length_penalty, max_input_length=0, return_scores=True,
                   return_end_token=True, suppress_sequences=[[pieces[PAD_ID]], [pieces[BOS_ID]], [pieces[-1]]])
    beam = dict(options, beam_size=beam_size, num_hypotheses=beam_size, patience=patience)
    candidates: list[Candidates] = [[] for _ in sequences]
    order = [i for i in sorted(range(len(sequences)), key=lambda i: len(sequences[i])) if limits[i] > 1]  # 1: EOS alone
    again: dict[int, list[int]] = {}  # limit → sentences whose beam search must run to their own limit
    for start in range(0, len(order), batch_size):
        chunk = order[start : start + batch_size]
        steps = max(limits[i] for i in chunk) - 1  # max_decoding_length: tokens without EOS
        if beam_size == 1 or greedy_floor:
            greedy = translator.translate_batch([sources[i] for i in chunk], beam_size=1, max_decoding_length=steps, **options)
            for i, result in zip(chunk, greedy):
                tokens = result.hypotheses[0]
                candidates[i].append((tokens[: limits[i] - 1], result.scores[0]) if len(tokens) >= limits[i] else (tokens, result.scores[0]))
        if beam_size > 1:
            for i, result in zip(chunk, translator.translate_batch([sources[i] for i in chunk], max_decoding_length=steps, **beam)):
                hypotheses = list(zip(result.hypotheses, result.scores))
                if limits[i] - 1 == steps or all(h[-1] == pieces[EOS_ID] and len(h) <= limits[i] - 2 for h, _ in hypotheses):
                    candidates[i].extend(hypotheses)
                else:
                    again.setdefault(limits[i], []).append(i)
    for limit, members in again.items():
        for start in range(0, len(members), batch_size):
            chunk = members[start : start + batch_size]
            for i, result in zip(chunk, translator.translate_batch([sources[i] for i in chunk], max_decoding_length=limit - 1, **beam)):
                candidates[i].extend(zip(result.hypotheses, result.scores))
    _end_cut_hypotheses(translator, sources, candidates, pieces[EOS_ID], length_penalty)
    index = {piece: i for i, piece in enumerate(pieces)}
    return [[index[piece] for piece in max(row, key=lambda h: h[1])[0][:-1]] if row else [] for row in candidates]


def _end_cut_hypotheses(translator: Any, sources: list[list[str]], candidates: list[Candidates], eos: str,
                        length_penalty: float) -> None:
    """Where a hypothesis was cut at its limit without EOS, ours forces EOS on the next step: append it and
    score the whole from `score_batch` (sum of log-probs, EOS's included, / len**length_penalty), in place.
    CTranslate2's own scores are sum / len**length_penalty, len counting EOS as it is returned, as ours."""
    cut = [(row, j) for row, hypotheses in enumerate(candidates) for j, (tokens, _) in enumerate(hypotheses)
           if not tokens or tokens[-1] != eos]
    if not cut:
        return
    results = translator.score_batch([sources[row] for row, _ in cut], [candidates[row][j][0] for row, j in cut])
    for (row, j), result in zip(cut, results):
        tokens = candidates[row][j][0] + [eos]
        candidates[row][j] = (tokens, sum(result.log_probs) / len(tokens) ** length_penalty)


def translate_plain(translator: Any, ct2_dir: Path, sequences: list[list[int]], beam_size: int = 4,
                    length_penalty: float = 1.0, max_len_a: float = 1.2, max_len_b: int = 10, batch_size: int = 64,
                    min_length: bool = False) -> list[list[int]]:
    """CTranslate2 as one runs it: one `translate_batch` per length-sorted batch, to the batch's longest limit
    (int(a·|x| + b) with EOS), pad, BOS and the blank suppressed; ids without specials, in input order. Not
    exactly our search's outputs (`translate_ids` is); `min_length` forces every output to the batch's limit
    (timing untrained models, which never end a sentence early)."""
    pieces = _pieces_of(ct2_dir)
    max_positions = json.loads((Path(ct2_dir) / "reder.json").read_text(encoding="utf-8"))["max_positions"]
    index = {piece: i for i, piece in enumerate(pieces)}
    suppress = [[pieces[PAD_ID]], [pieces[BOS_ID]], [pieces[-1]]]
    order = sorted(range(len(sequences)), key=lambda i: len(sequences[i]))
    outputs: list[list[int]] = [[] for _ in sequences]
    for start in range(0, len(order), batch_size):
        chunk = order[start : start + batch_size]
        steps = max(output_limits([len(sequences[i]) for i in chunk], max_len_a, max_len_b, max_positions)) - 1
        results = translator.translate_batch([[pieces[t] for t in sequences[i]] for i in chunk], beam_size=beam_size,
                                             length_penalty=length_penalty, max_decoding_length=max(1, steps),
                                             min_decoding_length=steps if min_length else 0, max_input_length=0,
                                             suppress_sequences=suppress)
        for i, result in zip(chunk, results):
            outputs[i] = [index[piece] for piece in result.hypotheses[0] if piece != pieces[EOS_ID]]
    return outputs
