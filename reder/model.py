"""REDER: one end of reversible layers per language; x→y runs x's end regular then y's end inverse."""
import math
from typing import Any, Callable, Optional

import torch
import torch.nn.functional as F
from torch import nn

from reder.config import DIRECTIONS, PAD_ID, LossConfig, ModelConfig
from reder.ctc import valid_mask
from reder.decode import CUTOFF_PROB, CUTOFF_TOP_N, strip_special
from reder.heads import HEADS, HeadOutput, make_head
from reder.inference import real_rows, run_inference
from reder.layers import ActNorm, DuplexLayer, LayerRng
from reder.losses import forward_backward_agreement, glance_mask
from reder.reversible import Op, invert_ops, run_trunk

ENDS = {"src2tgt": ("src", "tgt"), "tgt2src": ("tgt", "src")}  # direction → (reading end, writing end)
REVERSE = {"src2tgt": "tgt2src", "tgt2src": "src2tgt"}


def _check_direction(direction: str) -> None:
    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be one of {DIRECTIONS}, got {direction!r}")


class REDER(nn.Module):
    """The reversible duplex Transformer (Zheng et al., NeurIPS 2021), with an output head at both ends.

    Convention: the reading end runs its layers 1..L/2 in regular form, the writing end its layers L/2..1
    in inverse form, so tgt2src is exactly the inverse map of src2tgt (docs/DESIGN.md, "The model"). The
    head (reder/heads.py, `cfg.head`: CTC or DAG) upsamples the input and owns the output side; the trunk is
    the same for all.
    The head's parameters are saved under their own names at the top level (`links.*`, as before heads
    were modules), not under `head.`: model directories stay the same whatever the code's layout.
    `blank_penalty` (direction → c) is subtracted from the CTC blank's logit whenever the model decodes (greedy,
    beam, n-best), not in training: tuned on the validation split by the train stage, it is no parameter but
    travels in the model directory's config.json (reder/checkpoint.py); 0 = the model's own calibration.
    """

    def __init__(self, cfg: ModelConfig, loss_config: Optional[LossConfig] = None) -> None:
        super().__init__()
        self.cfg = cfg
        self.loss_config = loss_config or LossConfig()
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model, padding_idx=PAD_ID)
        nn.init.normal_(self.embed.weight, std=cfg.d_model**-0.5)
        self.positions = nn.ModuleDict({end: nn.Embedding(cfg.max_positions, cfg.d_model) for end in ("src", "tgt")})
        src_end = nn.ModuleList(DuplexLayer(cfg) for _ in range(cfg.layers_per_end))
        tgt_end = src_end if cfg.share_ends else nn.ModuleList(DuplexLayer(cfg) for _ in range(cfg.layers_per_end))
        self.ends = nn.ModuleDict({"src": src_end, "tgt": tgt_end})
        self.actnorm = nn.ModuleDict({end: ActNorm(2 * cfg.d_model) for end in ("src", "tgt")})
        self.dropout = nn.Dropout(cfg.dropout)
        self.head = make_head(cfg)  # last: parameter order and initialisation are those of the model before heads
        self.blank_penalty: dict[str, float] = dict.fromkeys(DIRECTIONS, 0.0)
        self.fast_inference = True  # eval without gradients: reder/inference.py's trunk (False: the reference path)
        self.static_trunk: Optional[Callable[..., torch.Tensor]] = None  # reder/static.py's compiled trunk, an option
        self.register_state_dict_post_hook(_flatten_head_keys)
        self.register_load_state_dict_pre_hook(_nest_head_keys)
        self.register_load_state_dict_post_hook(_flatten_incompatible_keys)

    def ops(self, direction: str) -> list[Op]:
        """The trunk's steps for a direction: reading end regular 1..L/2, then writing end inverse L/2..1."""
        _check_direction(direction)
        reading, writing = ENDS[direction]
        return [(layer, False) for layer in self.ends[reading]] + [(layer, True) for layer in reversed(self.ends[writing])]

    def layers(self, h: torch.Tensor, mask: torch.Tensor, direction: str) -> torch.Tensor:
        """The trunk alone on continuous states h (B, T, 2D); layers(layers(h, m, d), m, reverse d) == h. In eval
        mode without gradients (and `fast_inference`), reder/inference.py's trunk, or the `static_trunk` when set
        (reder/static.py: at bucketed shapes under torch.compile): padded positions come out zero."""
        if self._fast_path():
            if self.static_trunk is not None:
                return self.static_trunk(h, mask, self.ops(direction))
            return run_inference(h, mask, self.ops(direction))
        states, _ = run_trunk(h, mask, self.ops(direction), self.cfg.memory_efficient)
        return states[-1]

    def max_input_length(self) -> int:
        """The longest input (pieces with EOS) whose upsampled sequence fits in max_positions."""
        return self.head.max_input_length()

    def embed_input(
        self, tokens: torch.Tensor, lengths: torch.Tensor, end: str, upsample: bool = True, dropout: bool = True,
        glance: Optional[tuple[torch.Tensor, torch.Tensor]] = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """tokens (B, T) ending in EOS → H₀ (B, T', 2D) after ActNorm, its mask and lengths; T' the head's
        upsampled length, or T without upsampling (FBA's reverse pass reads an already laid-out target).
        `glance` (positions (B, T') bool, tokens (B, T')): those tokens replace the upsampled input there."""
        if upsample:
            tokens, lengths = self.head.upsample(tokens, lengths)
        if glance is not None:
            tokens = torch.where(glance[0], glance[1], tokens)
        length = tokens.shape[1]
        if length > self.cfg.max_positions:
            raise ValueError(f"input of {length} positions (after upsampling) exceeds max_positions={self.cfg.max_positions}")
        mask = valid_mask(lengths, length)
        e = math.sqrt(self.cfg.d_model) * self.embed(tokens) + self.positions[end].weight[:length]  # (B, rT, D)
        if dropout:
            e = self.dropout(e)
        h = torch.cat([e, e], dim=-1)  # (B, rT, 2D)
        if self.training and not self.actnorm[end].is_initialized():
            self.actnorm[end].initialize(h, mask)
        return self.actnorm[end](h), mask, lengths

    def project(self, h: torch.Tensor, lengths: torch.Tensor, end: str, normalise: bool = True,
                blank_penalty: float = 0.0, rows: Optional[torch.Tensor] = None) -> HeadOutput:
        """Writing end: inverse ActNorm, average the halves into output states o (B, T, D), tied logits →
        log-probs (B, T, V) in the head's dtype (float32 or wider), plus what the head adds over o. With
        normalise=False the log_probs field holds the logits themselves (for an argmax, which they share).
        `blank_penalty` c is subtracted from the blank's logit before normalising: P(blank) lowered by e^c
        relative to every other token, a proper distribution still (decoding only). `rows` (the inference path's
        real positions in B·T, reder/inference.py): logits only there, zero logits at padded positions."""
        first, second = self.actnorm[end].inverse(h).chunk(2, dim=-1)
        states = (first + second) / 2  # (B, T, D)
        if rows is None:
            logits = states @ self.embed.weight.t()  # (B, T, V)
        else:
            batch, length, width = states.shape
            packed = states.reshape(batch * length, width).index_select(0, rows) @ self.embed.weight.t()  # (N, V)
            logits = packed.new_zeros(batch * length, packed.shape[-1]).index_copy_(0, rows, packed).view(batch, length, -1)
        if blank_penalty:
            logits = logits.clone()
            logits[..., self.cfg.blank_id] -= blank_penalty
        log_probs = F.log_softmax(logits.to(self.head.log_prob_dtype(logits.dtype)), dim=-1) if normalise else logits
        return HeadOutput(log_probs, lengths, self.head.extra(states, lengths, end))

    def outputs(self, tokens: torch.Tensor, lengths: torch.Tensor, direction: str, normalise: bool = True,
                blank_penalty: float = 0.0) -> HeadOutput:
        """tokens (B, T) → the writing end's output: log-probabilities (B, T', V) (logits with normalise=False;
        the blank's lowered by `blank_penalty`), lengths (B,), the head's extras."""
        _check_direction(direction)
        reading, writing = ENDS[direction]
        h, mask, out_lengths = self.embed_input(tokens, lengths, reading)
        rows = real_rows(mask) if self._fast_path() else None  # the output projection skips padded positions too
        return self.project(self.layers(h, mask, direction), out_lengths, writing, normalise, blank_penalty, rows)

    def _fast_path(self) -> bool:
        return self.fast_inference and not self.training and not torch.is_grad_enabled()

    def decoding_penalty(self, direction: str, blank_penalty: Optional[float] = None) -> float:
        """The blank penalty decoding `direction` applies: `blank_penalty` if given, else the model's own."""
        penalty = self.blank_penalty[direction] if blank_penalty is None else float(blank_penalty)
        if penalty and not self.head.emits_blank:
            raise ValueError(f"a blank penalty ({penalty}) needs a CTC model; this model's head is {self.cfg.head!r}")
        return penalty

    def forward(self, tokens: torch.Tensor, lengths: torch.Tensor, direction: str) -> tuple[torch.Tensor, torch.Tensor]:
        """tokens (B, T) → log-probabilities (B, T', V) and output lengths (B,); T' the head's upsampled length."""
        output = self.outputs(tokens, lengths, direction)
        return output.log_probs, output.lengths

    def initialize(self, src_tokens: torch.Tensor, src_lengths: torch.Tensor, tgt_tokens: torch.Tensor, tgt_lengths: torch.Tensor) -> None:
        """Data-initialise both ends' ActNorm from one batch (done by the first `loss` call in training)."""
        with torch.no_grad():
            for tokens, lengths, end in ((src_tokens, src_lengths, "src"), (tgt_tokens, tgt_lengths, "tgt")):
                if not self.actnorm[end].is_initialized():
                    self.embed_input(tokens, lengths, end)

    def loss(
        self,
        src_tokens: torch.Tensor,
        src_lengths: torch.Tensor,
        tgt_tokens: torch.Tensor,
        tgt_lengths: torch.Tensor,
        step: int,
        directions: Optional[tuple[str, ...]] = None,
    ) -> dict[str, torch.Tensor]:
        """Named loss terms per direction (default: the loss config's `directions`) and their weighted `total`
        (FBA from `loss_config.start_step("fba")`, CC from `start_step("cc")`).

        The main term is `<head>_<direction>` (`ctc_…`, `dag_…`); `fba_…` and `cc_…` only while that term is on
        (step past its start, weight > 0): a term that was not computed is absent, not a zero, so a trainer's
        mean over updates averages it over the updates that computed it. A head's counters follow, for the main
        term and for CC (DAG: the samples dropped because the graph was shorter than the target, `dropped_…`,
        `dropped_cc_…` while CC is on); counters are logged, never added to `total`.

        Passing one direction at a time and calling backward on each total bounds memory: with one joint
        backward, each layer's parameter gradient from one direction waits in autograd's buffers until the
        other direction's backward reaches that layer (one extra copy of the trunk's gradients at peak).
        """
        directions = self.loss_config.directions if directions is None else directions
        for direction in directions:
            _check_direction(direction)
        if self.training:
            self.initialize(src_tokens, src_lengths, tgt_tokens, tgt_lengths)
        config = self.loss_config
        use_fba = step >= config.start_step("fba") and config.lambda_fba > 0
        use_cc = step >= config.start_step("cc") and config.lambda_cc > 0
        zero, name = src_tokens.new_zeros((), dtype=torch.float32), self.head.name
        terms: dict[str, torch.Tensor] = {}
        pairs = {"src2tgt": (src_tokens, src_lengths, tgt_tokens, tgt_lengths), "tgt2src": (tgt_tokens, tgt_lengths, src_tokens, src_lengths)}
        ratio = config.glance_ratio(step) if self.training else 0.0
        total = zero
        for direction in directions:
            x, x_lengths, y, y_lengths = pairs[direction]
            main, fba, cc, counts, cc_counts = self._direction_loss(direction, x, x_lengths, y, y_lengths, use_fba, use_cc,
                                                                    ratio)
            terms[f"{name}_{direction}"] = main
            total = total + main
            if fba is not None:
                terms[f"fba_{direction}"] = fba
                total = total + config.lambda_fba * fba
            if cc is not None:
                terms[f"cc_{direction}"] = cc
                total = total + config.lambda_cc * cc
            for counter in self.head.counters:
                terms[f"{counter}_{direction}"] = zero + counts[counter]
                if counter in cc_counts:
                    terms[f"{counter}_cc_{direction}"] = zero + cc_counts[counter]
        terms["total"] = total
        return terms

    def _direction_loss(
        self, direction: str, x: torch.Tensor, x_lengths: torch.Tensor, y: torch.Tensor, y_lengths: torch.Tensor, use_fba: bool,
        use_cc: bool, glance_ratio: float = 0.0,
    ) -> tuple[torch.Tensor, Optional[torch.Tensor], Optional[torch.Tensor], dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        reading, writing = ENDS[direction]
        glance = self.glance(direction, x, x_lengths, y, y_lengths, glance_ratio) if glance_ratio > 0 else None
        h0, mask, out_lengths = self.embed_input(x, x_lengths, reading, glance=glance)
        ops = self.ops(direction)
        states, rngs = run_trunk(h0, mask, ops, self.cfg.memory_efficient, keep_all=use_fba)
        output = self.project(states[-1], out_lengths, writing)  # log-probs (B, T', V), DAG: log E (B, T', T')
        main, counts = self.head.loss(output, y, y_lengths)
        output = output.detach()
        fba = self._agreement([h0, *states], mask, output, y, y_lengths, ops, rngs, writing) if use_fba else None
        cc, cc_counts = self._cycle(output, x, x_lengths, REVERSE[direction]) if use_cc else (None, {})
        return main, fba, cc, counts, cc_counts

    def glance(self, direction: str, x: torch.Tensor, x_lengths: torch.Tensor, y: torch.Tensor, y_lengths: torch.Tensor,
               ratio: float, generator: Optional[torch.Generator] = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Glancing's first pass (no gradient): y laid out on the output positions by the head (FBA's layout:
        CTC its best alignment, DAG its Viterbi path), and the positions whose aligned target token goes into
        the second pass's input (`glance_mask`: among the aligned target tokens — not blanks, not off-path
        vertices — of feasible samples). Returns (positions (B, T') bool, layout tokens (B, T'))."""
        with torch.no_grad():
            first = self.outputs(x, x_lengths, direction)
            layout, compared, feasible = self.head.fba_layout(first, y, y_lengths)
            candidates = compared & feasible[:, None] & (layout != self.cfg.blank_id)
            return glance_mask(layout, candidates, first.log_probs.argmax(dim=-1), ratio, generator), layout

    def _agreement(
        self,
        forward_states: list[torch.Tensor],
        mask: torch.Tensor,
        output: HeadOutput,
        y: torch.Tensor,
        y_lengths: torch.Tensor,
        ops: list[Op],
        rngs: list[LayerRng],
        writing: str,
    ) -> torch.Tensor:
        """FBA: run the reverse direction on y laid out on the output positions by the head (no upsampling,
        same dropout masks, no gradient) and pull every compared forward state towards the reverse state it
        lines up with. CTC: the best alignment a*, all positions compared. DAG: Y on its Viterbi path, the
        skip token elsewhere, only on-path positions compared."""
        with torch.no_grad():
            layout, compared, feasible = self.head.fba_layout(output, y, y_lengths)  # (B, T'), (B, T'), (B,)
            g0, _, _ = self.embed_input(layout, output.lengths, writing, upsample=False, dropout=False)
            reverse_states = self.reverse_states(g0, mask, ops, rngs)
        return forward_backward_agreement(forward_states, reverse_states, compared & feasible[:, None])

    @staticmethod
    def reverse_states(g0: torch.Tensor, mask: torch.Tensor, ops: list[Op], rngs: list[LayerRng]) -> list[torch.Tensor]:
        """Run the inverse of `ops` from g0 with the forward pass's dropout masks; return its L+1 states in
        reverse order, so entry k lines up with the forward state after k steps."""
        reverse, _ = run_trunk(g0, mask, invert_ops(ops), memory_efficient=False, keep_all=True, rngs=rngs[::-1])
        return [g0, *reverse][::-1]

    def _cycle(
        self, output: HeadOutput, x: torch.Tensor, x_lengths: torch.Tensor, back: str
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """CC: decode the output with hard tokens (the head's: CTC per-frame argmax collapsed, blanks kept;
        DAG greedy with EOS), translate them back, and score the original x with the head's loss."""
        y_bar, y_bar_lengths = self.head.cycle_input(output)
        return self.head.loss(self.outputs(y_bar, y_bar_lengths, back), x, x_lengths)

    @torch.inference_mode()
    def translate(
        self, tokens: torch.Tensor, lengths: torch.Tensor, direction: str, beam_size: int = 1, decoder: str = "greedy",
        blank_penalty: Optional[float] = None, **options: float,
    ) -> list[list[int]]:
        """Token ids (B, T) ending in EOS → one hypothesis per sentence (ids; BOS, EOS and blanks removed).

        The head's decoders: CTC greedy, or prefix beam search with beam_size > 1; DAG greedy, lookahead or
        viterbi, or its beam search with beam_size > 1. `options`: any head's `decode_options` (CTC: the
        per-frame cutoffs of reder.decode.frame_candidates; DAG: max_transition, no_repeat_ngram,
        dag_length_penalty); those of the other head are ignored. Under inference mode; a head whose greedy
        decoder is a per-position argmax (CTC) gets the logits without the log-softmax. CTC: the blank's logit
        is lowered by `blank_penalty` (None: the model's own `blank_penalty` of the direction)."""
        known = {name for head in HEADS.values() for name in head.decode_options}
        if set(options) - known:
            raise TypeError(f"unknown decoding options {sorted(set(options) - known)}; known: {sorted(known)}")
        normalise = not (beam_size == 1 and decoder == "greedy" and self.head.argmax_greedy)
        output = self.outputs(tokens, lengths, direction, normalise, self.decoding_penalty(direction, blank_penalty))
        own = {name: value for name, value in options.items() if name in self.head.decode_options}
        hypotheses = self.head.decode(output, decoder, beam_size, **own)
        return [strip_special(h, self.cfg.blank_id) for h in hypotheses]

    @torch.no_grad()
    def nbest(self, tokens: torch.Tensor, lengths: torch.Tensor, direction: str, beam_size: int,
              cutoff_top_n: int = CUTOFF_TOP_N, cutoff_prob: float = CUTOFF_PROB,
              blank_penalty: Optional[float] = None) -> list[list[tuple[list[int], float]]]:
        """The CTC beam's n-best per sentence, best first: (ids with specials stripped, the normalised forward
        score log P(y|x)/|y| of the raw labels, under the blank penalty as `translate` applies it); of raw
        labels equal after stripping only the best stays."""
        if not self.head.reranks:
            raise ValueError(f"candidates need a CTC head, this model's head is {self.cfg.head!r}")
        output = self.outputs(tokens, lengths, direction, blank_penalty=self.decoding_penalty(direction, blank_penalty))
        nbest = self.head.nbest(output, beam_size, cutoff_top_n, cutoff_prob)
        results = []
        for entries in nbest:
            seen: dict[tuple[int, ...], float] = {}
            for labels, score in entries:
                seen.setdefault(tuple(strip_special(labels, self.cfg.blank_id)), score)
            results.append([(list(ids), score) for ids, score in seen.items()])
        return results

    def candidates(self, tokens: torch.Tensor, lengths: torch.Tensor, direction: str, beam_size: int,
                   cutoff_top_n: int = CUTOFF_TOP_N, cutoff_prob: float = CUTOFF_PROB,
                   blank_penalty: Optional[float] = None) -> list[list[list[int]]]:
        """The ids of `nbest` alone (best first, specials stripped, duplicates merged): for reranking."""
        return [[ids for ids, _ in entries]
                for entries in self.nbest(tokens, lengths, direction, beam_size, cutoff_top_n, cutoff_prob, blank_penalty)]


def _flatten_head_keys(module: nn.Module, state: dict[str, Any], prefix: str, local_metadata: dict[str, Any]) -> None:
    """state_dict hook: the head's entries go under `prefix` + their own names (`links.…`), not `head.links.…`."""
    for key in [key for key in state if key.startswith(prefix + "head.")]:  # the head is the last child:
        state[prefix + key[len(prefix + "head."):]] = state.pop(key)  # re-inserting keeps the state's order


def _nest_head_keys(module: nn.Module, state: dict[str, Any], prefix: str, *_: Any) -> None:
    """load_state_dict pre-hook: saved `prefix` + `links.…` entries go to the head's `head.links.…`."""
    owned = tuple(f"{prefix}{name}." for name, _ in module.head.named_children())
    for key in [key for key in state if key.startswith(owned)]:
        state[prefix + "head." + key[len(prefix):]] = state.pop(key)


def _flatten_incompatible_keys(module: nn.Module, incompatible: Any) -> None:
    """load_state_dict post-hook: missing or unexpected head entries are named as saved (`links.…`)."""
    for marker in [f"head.{name}." for name, _ in module.head.named_children()]:
        for keys in (incompatible.missing_keys, incompatible.unexpected_keys):
            keys[:] = [key.replace(marker, marker[len("head."):], 1) if key.startswith(marker) or f".{marker}" in key else key
                       for key in keys]
