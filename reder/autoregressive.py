"""The autoregressive Transformer: the distillation teacher (one per direction) and the AR baseline.

fairseq-style encoder–decoder: pre-norm layers (LayerNorm before each sublayer, a final LayerNorm on each
stack), ReLU FFN, one token embedding shared by source, target and the output projection (tied), scaled by
√D, plus fixed sinusoidal positions in fairseq's layout (sines then cosines): no parameters, and nothing
tied to the lengths seen in training. Sequences follow REDER's convention: right-padded rows ending in EOS;
the decoder reads [BOS, y_1 … y_{T−1}] and predicts [y_1 … EOS]. Decoding is batched (all sentences and
beams in one tensor) over a key/value cache; pad, BOS and the CTC blank are never generated.
"""
import math
from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch import nn

from reder.attention import sdpa
from reder.config import BOS_ID, EOS_ID, PAD_ID, TransformerConfig
from reder.ctc import valid_mask

KeysValues = tuple[torch.Tensor, torch.Tensor]  # keys and values, (N, H, S, D/H) each


def sinusoids(length: int, dim: int) -> torch.Tensor:
    """fairseq's sinusoidal position table (length, dim): the sines of all frequencies, then the cosines."""
    half = dim // 2
    frequencies = torch.exp(torch.arange(half, dtype=torch.float64) * -(math.log(10000.0) / max(1, half - 1)))
    angles = torch.arange(length, dtype=torch.float64)[:, None] * frequencies[None, :]  # (L, D/2)
    return torch.cat([angles.sin(), angles.cos()], dim=1).float()  # (L, D)


def output_limits(src_lengths: list[int], max_len_a: float, max_len_b: int, max_positions: int) -> list[int]:
    """Longest output (with EOS) per sentence: int(a·|x| + b), |x| with EOS, within [1, max_positions] (our
    search; reder.ct2 mirrors it)."""
    return [min(max(1, int(max_len_a * n + max_len_b)), max_positions) for n in src_lengths]


class Attention(nn.Module):
    """Multi-head attention; keys/values are projected apart from the queries so that they can be cached."""

    def __init__(self, d_model: int, n_heads: int, dropout: float) -> None:
        super().__init__()
        self.n_heads, self.dropout = n_heads, dropout
        self.query, self.key, self.value, self.out = (nn.Linear(d_model, d_model) for _ in range(4))

    def _split(self, x: torch.Tensor) -> torch.Tensor:
        return x.unflatten(-1, (self.n_heads, -1)).transpose(1, 2)  # (N, T, D) → (N, H, T, D/H)

    def keys_values(self, x: torch.Tensor) -> KeysValues:
        """The keys and values of states x (N, S, D)."""
        return self._split(self.key(x)), self._split(self.value(x))

    def forward(self, x: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: Optional[torch.Tensor],
                is_causal: bool = False) -> torch.Tensor:
        """x (N, T, D) attends to keys/values (N, H, S, D/H); bool mask broadcast to (N, H, T, S), True = may attend;
        or, with `is_causal` (T = S, no mask), position i to positions ≤ i."""
        out = sdpa(self._split(self.query(x)), keys, values, attn_mask=mask,
                   dropout_p=self.dropout if self.training else 0.0, is_causal=is_causal)  # (N, H, T, D/H)
        return self.out(out.transpose(1, 2).flatten(2))  # (N, T, D)


def log_softmax_fp32(logits: torch.Tensor) -> torch.Tensor:
    """log_softmax over the last dimension, in float32 or wider (logits under autocast may be bf16)."""
    return F.log_softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), dim=-1)


def _ffn(cfg: TransformerConfig) -> nn.Module:
    return nn.Sequential(nn.Linear(cfg.d_model, cfg.ffn_dim), nn.ReLU(), nn.Linear(cfg.ffn_dim, cfg.d_model))


class EncoderLayer(nn.Module):
    """Pre-norm self-attention and FFN sublayers."""

    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        self.attention, self.ffn = Attention(cfg.d_model, cfg.n_heads, cfg.attention_dropout), _ffn(cfg)
        self.attention_norm, self.ffn_norm = nn.LayerNorm(cfg.d_model), nn.LayerNorm(cfg.d_model)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """x (B, S, D), key mask (B, 1, 1, S) → (B, S, D)."""
        h = self.attention_norm(x)
        x = x + self.dropout(self.attention(h, *self.attention.keys_values(h), mask))
        return x + self.dropout(self.ffn(self.ffn_norm(x)))


class DecoderLayer(nn.Module):
    """Pre-norm causal self-attention (over cached and new positions), cross-attention and FFN sublayers."""

    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        self.self_attention = Attention(cfg.d_model, cfg.n_heads, cfg.attention_dropout)
        self.cross_attention, self.ffn = Attention(cfg.d_model, cfg.n_heads, cfg.attention_dropout), _ffn(cfg)
        self.self_norm, self.cross_norm, self.ffn_norm = (nn.LayerNorm(cfg.d_model) for _ in range(3))
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor, cross: KeysValues, src_mask: torch.Tensor, past: Optional[KeysValues]) -> tuple[torch.Tensor, KeysValues]:
        """x (N, t, D): the t newest positions; past: the self-attention keys/values of the earlier ones."""
        h = self.self_norm(x)
        keys, values = self.self_attention.keys_values(h)
        if past is not None:
            keys, values = torch.cat([past[0], keys], dim=2), torch.cat([past[1], values], dim=2)  # (N, H, S, D/H)
        t, s = x.shape[1], keys.shape[2]
        if t > 1 and t == s:  # teacher forcing: SDPA's own causal mask, no mask tensor (fused kernels take it)
            x = x + self.dropout(self.self_attention(h, keys, values, None, is_causal=True))
        else:  # new i sees ≤ i (one new position sees all)
            causal = torch.ones(t, s, dtype=torch.bool, device=x.device).tril(s - t) if t > 1 else None
            x = x + self.dropout(self.self_attention(h, keys, values, causal))
        x = x + self.dropout(self.cross_attention(self.cross_norm(x), *cross, src_mask))
        return x + self.dropout(self.ffn(self.ffn_norm(x))), (keys, values)


@dataclass
class DecoderCache:
    """Incremental decoding state: per decoder layer, the encoder memory's keys/values (computed once) and
    the self-attention keys/values of the positions decoded so far."""

    cross: list[KeysValues]
    src_mask: torch.Tensor  # (N, 1, 1, S)
    past: list[Optional[KeysValues]]
    length: int = 0  # positions decoded so far

    def select(self, rows: torch.Tensor, memory: bool = False) -> None:
        """Keep decoder rows `rows` (N',), e.g. reselected beams. The encoder side moves only with memory=True:
        beams reselected within their own sentence share that sentence's memory."""
        def pick(kv: KeysValues) -> KeysValues:
            return kv[0].index_select(0, rows), kv[1].index_select(0, rows)

        self.past = [None if kv is None else pick(kv) for kv in self.past]
        if memory:
            self.cross, self.src_mask = [pick(kv) for kv in self.cross], self.src_mask.index_select(0, rows)


class EncoderDecoder(nn.Module):
    """What the teacher and the CMLM (reder/cmlm.py) share: a token embedding (tied to the output projection),
    sinusoidal positions, a pre-norm encoder, a stack of `decoder_layer`s, final norms and fairseq's
    initialisation; `add_heads` adds a subclass's own modules before the initialisation (the CMLM's length head)."""

    def __init__(self, cfg: TransformerConfig, decoder_layer: Callable[[TransformerConfig], nn.Module]) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model, padding_idx=PAD_ID)
        self.register_buffer("positions", sinusoids(cfg.max_positions, cfg.d_model), persistent=False)
        self.encoder = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.encoder_layers))
        self.decoder = nn.ModuleList(decoder_layer(cfg) for _ in range(cfg.decoder_layers))
        self.encoder_norm, self.decoder_norm = nn.LayerNorm(cfg.d_model), nn.LayerNorm(cfg.d_model)
        self.add_heads()
        self.dropout = nn.Dropout(cfg.dropout)
        for module in self.modules():  # fairseq's initialisation
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                nn.init.zeros_(module.bias)
        nn.init.normal_(self.embed.weight, std=cfg.d_model**-0.5)
        nn.init.zeros_(self.embed.weight[PAD_ID])

    def add_heads(self) -> None:
        """A subclass's modules beyond the shared ones (none here)."""

    def max_input_length(self) -> int:
        """The longest source (pieces with EOS) it accepts."""
        return self.cfg.max_positions

    def _embed(self, tokens: torch.Tensor, offset: int = 0) -> torch.Tensor:
        end = offset + tokens.shape[1]
        if end > self.cfg.max_positions:
            raise ValueError(f"sequence of {end} positions exceeds max_positions={self.cfg.max_positions}")
        return self.dropout(math.sqrt(self.cfg.d_model) * self.embed(tokens) + self.positions[offset:end])  # (N, T, D)

    def encode(self, src_tokens: torch.Tensor, src_lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Source (B, S) → encoder memory (B, S, D) and its padding mask (B, S)."""
        mask = valid_mask(src_lengths, src_tokens.shape[1])
        x = self._embed(src_tokens)
        for layer in self.encoder:
            x = layer(x, mask[:, None, None, :])
        return self.encoder_norm(x), mask


class Transformer(EncoderDecoder):
    """Encoder–decoder Transformer for one direction (see module doc)."""

    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__(cfg, DecoderLayer)

    def start(self, memory: torch.Tensor, src_mask: torch.Tensor) -> DecoderCache:
        """An empty decoder cache over encoder memory (N, S, D) and its mask (N, S)."""
        cross = [layer.cross_attention.keys_values(memory) for layer in self.decoder]
        return DecoderCache(cross, src_mask[:, None, None, :], [None] * len(self.decoder))

    def _decode(self, prev_tokens: torch.Tensor, cache: DecoderCache) -> torch.Tensor:
        x = self._embed(prev_tokens, cache.length)
        for index, layer in enumerate(self.decoder):
            x, cache.past[index] = layer(x, cache.cross[index], cache.src_mask, cache.past[index])
        cache.length += prev_tokens.shape[1]
        return self.decoder_norm(x) @ self.embed.weight.t()  # (N, T, V): the tied output projection

    def decoder_logits(self, memory: torch.Tensor, src_mask: torch.Tensor, prev_tokens: torch.Tensor) -> torch.Tensor:
        """Teacher-forced decoder, all positions in one pass: prev_tokens (N, T) → logits (N, T, V)."""
        return self._decode(prev_tokens, self.start(memory, src_mask))

    def step(self, tokens: torch.Tensor, cache: DecoderCache) -> torch.Tensor:
        """One incremental step: each row's newest token (N,) → next-token logits (N, V); extends the cache."""
        return self._decode(tokens[:, None], cache)[:, 0]

    def target_log_probs(self, memory: torch.Tensor, src_mask: torch.Tensor, tgt_tokens: torch.Tensor) -> torch.Tensor:
        """Teacher-forced log-probabilities (B, T, V) of each position of targets (B, T), given encoder memory."""
        prev = torch.cat([torch.full_like(tgt_tokens[:, :1], BOS_ID), tgt_tokens[:, :-1]], dim=1)  # (B, T) shifted right
        return log_softmax_fp32(self.decoder_logits(memory, src_mask, prev))  # (B, T, V)

    @torch.no_grad()
    def score_encoded(self, memory: torch.Tensor, src_mask: torch.Tensor, tgt_tokens: torch.Tensor,
                      tgt_lengths: torch.Tensor) -> torch.Tensor:
        """Mean token log-probability (B,) of targets (B, T) ending in EOS, given encoder memory (B, S, D)."""
        log_probs = self.target_log_probs(memory, src_mask, tgt_tokens)
        token = log_probs.gather(-1, tgt_tokens[..., None]).squeeze(-1)  # (B, T)
        return token.masked_fill(~valid_mask(tgt_lengths, tgt_tokens.shape[1]), 0.0).sum(dim=1) / tgt_lengths

    @torch.no_grad()
    def score(self, src_tokens: torch.Tensor, src_lengths: torch.Tensor, tgt_tokens: torch.Tensor,
              tgt_lengths: torch.Tensor) -> torch.Tensor:
        """Mean token log-probability (B,) of each target (ending in EOS, EOS counted): one teacher-forced pass."""
        return self.score_encoded(*self.encode(src_tokens, src_lengths), tgt_tokens, tgt_lengths)

    def _limits(self, src_lengths: torch.Tensor, max_len_a: float, max_len_b: int) -> list[int]:
        return output_limits(src_lengths.tolist(), max_len_a, max_len_b, self.cfg.max_positions)

    def _next_log_probs(self, last: torch.Tensor, cache: DecoderCache, step: int, limits: torch.Tensor) -> torch.Tensor:
        """Log-probs (N, V) of output token number step+1: specials banned, only EOS where it reaches its limit."""
        log_probs = log_softmax_fp32(self.step(last, cache))  # (N, V)
        log_probs[:, [PAD_ID, BOS_ID, self.cfg.blank_id]] = -math.inf
        not_eos = torch.arange(log_probs.shape[1], device=last.device) != EOS_ID
        return log_probs.masked_fill((step + 1 >= limits)[:, None] & not_eos[None, :], -math.inf)

    @torch.no_grad()
    def greedy(self, src_tokens: torch.Tensor, src_lengths: torch.Tensor, max_len_a: float = 1.2,
               max_len_b: int = 10) -> list[list[int]]:
        """Batched greedy decoding: the argmax token until EOS; ids without BOS/EOS/pad."""
        limits = self._limits(src_lengths, max_len_a, max_len_b)
        cache = self.start(*self.encode(src_tokens, src_lengths))
        last = src_tokens.new_full((len(limits),), BOS_ID)
        done = torch.zeros(len(limits), dtype=torch.bool, device=src_tokens.device)
        row_limits, outputs = torch.tensor(limits, device=src_tokens.device), []
        for step in range(max(limits)):
            last = self._next_log_probs(last, cache, step, row_limits).argmax(dim=-1).masked_fill(done, PAD_ID)
            outputs.append(last)
            done |= last == EOS_ID
            if bool(done.all()):
                break
        return [row[: row.index(EOS_ID)] for row in torch.stack(outputs, dim=1).tolist()]

    @torch.no_grad()
    def beam_search(self, src_tokens: torch.Tensor, src_lengths: torch.Tensor, beam_size: int = 4, length_penalty: float = 1.0,
                    max_len_a: float = 1.2, max_len_b: int = 10) -> list[tuple[list[int], float]]:
        """Batched beam search: per sentence the best finished hypothesis (ids without specials) and its score,
        sum log-prob / len**length_penalty (len counts EOS).

        As fairseq, each step ranks the 2K best extensions of the K beams by summed log-prob; EOS extensions in
        the top K finish, the best K others go on. A sentence stops at its length limit (EOS forced) or once it
        has K finished hypotheses and its best live beam, ended now, would not beat the K-th best (so beam 1 is
        exactly greedy). With K > 1 a greedy row per sentence runs alongside and its hypothesis joins the
        finished ones: pruning can lose the greedy path, and the result never scores below greedy (as CTC's).
        Stopped sentences leave the batch."""
        if beam_size < 1:
            raise ValueError(f"beam_size must be >= 1, got {beam_size}")
        k, vocab, device = beam_size, self.cfg.vocab_size, src_tokens.device
        width = k + (k > 1)  # decoder rows per sentence: K beams, then the greedy row
        limits = self._limits(src_lengths, max_len_a, max_len_b)
        memory, src_mask = self.encode(src_tokens, src_lengths)
        cache = self.start(memory.repeat_interleave(width, dim=0), src_mask.repeat_interleave(width, dim=0))  # (B·W, S, D)
        alive = list(range(len(limits)))  # the sentence of each group of rows
        row_limits = torch.tensor(limits, device=device).repeat_interleave(width)  # (B·W,)
        # float64 sums keep the ranking of distinct float32 log-probs exact (beam 1 ≡ greedy)
        scores = torch.full((len(limits), width), -math.inf, dtype=torch.float64, device=device)
        scores[:, 0] = scores[:, k:] = 0.0  # the K beams start identical: one is live
        history, last = src_tokens.new_zeros(len(limits) * width, 0), src_tokens.new_full((len(limits) * width,), BOS_ID)
        finished: list[list[tuple[list[int], float]]] = [[] for _ in limits]
        greedy_finished: list[list[tuple[list[int], float]]] = [[] for _ in limits]
        # The stopping rule's state per live sentence, on the device, so that a step asks it for one list (which
        # sentences stop) instead of a number per finished hypothesis: the K best finished scores (descending),
        # how many hypotheses the beams finished, whether the greedy row did, and the length limit.
        best_finished = torch.full((len(limits), k), -math.inf, dtype=torch.float64, device=device)
        count_finished = torch.zeros(len(limits), dtype=torch.long, device=device)
        greedy_done = torch.full((len(limits),), width == k, dtype=torch.bool, device=device)  # no greedy row: done
        group_limits = torch.tensor(limits, device=device)
        for step in range(max(limits)):
            groups, divisor = len(alive), (step + 1) ** length_penalty
            log_probs = self._next_log_probs(last, cache, step, row_limits).view(groups, width, vocab)
            extended = (scores[:, :k, None] + log_probs[:, :k]).view(groups, k * vocab)  # (G, K·V)
            top_scores, top_index = extended.topk(2 * k, dim=1)  # (G, 2K)
            beams, tokens = top_index // vocab, top_index % vocab
            if width > k:  # the greedy row's argmax, as a (2K+1)-th candidate from row K
                best_log_prob, best_token = log_probs[:, k].max(dim=-1)
                top_scores = torch.cat([top_scores, scores[:, k:] + best_log_prob[:, None]], dim=1)  # (G, 2K+1)
                beams, tokens = F.pad(beams, (0, 1), value=k), torch.cat([tokens, best_token[:, None]], dim=1)
            is_eos = tokens == EOS_ID
            ending = is_eos & top_scores.isfinite()
            ending[:, k : 2 * k] = False  # EOS beyond the top K does not finish (fairseq)
            ends = ending.nonzero()  # (F, 2): group, candidate
            hypotheses = history[ends[:, 0] * width + beams[ends[:, 0], ends[:, 1]]].tolist()
            end_scores = (top_scores[ends[:, 0], ends[:, 1]] / divisor).tolist()
            for (group, j), hypothesis, score in zip(ends.tolist(), hypotheses, end_scores):
                (finished if j < k else greedy_finished)[alive[group]].append((hypothesis, score))
            beam_ends = ending[:, :k]  # (G, K): only the top K candidates can finish a beam
            count_finished += beam_ends.sum(dim=1)
            best_finished = torch.cat([best_finished, (top_scores[:, :k] / divisor).masked_fill(~beam_ends, -math.inf)],
                                      dim=1).topk(k, dim=1).values
            if width > k:
                greedy_done |= ending[:, 2 * k]
            order = (is_eos[:, : 2 * k].long() * 2 * k + torch.arange(2 * k, device=device)).argsort(dim=1)[:, :k]  # (G, K): the best K going on
            order = F.pad(order, (0, width - k), value=2 * k)  # (G, W): the greedy row goes on in its place
            scores, beams, tokens = top_scores.gather(1, order), beams.gather(1, order), tokens.gather(1, order)
            scores[:, k:] = scores[:, k:].masked_fill(tokens[:, k:] == EOS_ID, -math.inf)  # an ended greedy row stays dead
            rows = (torch.arange(groups, device=device)[:, None] * width + beams).view(-1)  # (G·W,)
            cache.select(rows)
            history, last = torch.cat([history[rows], tokens.view(-1, 1)], dim=1), tokens.view(-1)  # (G·W, t+1)
            # a sentence stops at its limit, or with K finished, the greedy row's too, and the K-th best of them
            # no worse than its best live beam ended now
            best_live = scores[:, :k].max(dim=1).values / divisor
            stopped = ((step + 1 >= group_limits) | ((count_finished >= k) & greedy_done
                                                     & (best_finished[:, k - 1] >= best_live))).tolist()
            if all(stopped):
                break
            if any(stopped):
                keep = torch.tensor([g for g, s in enumerate(stopped) if not s], device=device)
                rows = (keep[:, None] * width + torch.arange(width, device=device)).view(-1)  # (G'·W,)
                cache.select(rows, memory=True)
                history, last, row_limits, scores = history[rows], last[rows], row_limits[rows], scores[keep]
                best_finished, count_finished = best_finished[keep], count_finished[keep]
                greedy_done, group_limits = greedy_done[keep], group_limits[keep]
                alive = [alive[g] for g in keep.tolist()]
        return [max(finished[b] + greedy_finished[b], key=lambda h: h[1]) for b in range(len(limits))]
