"""The conditional masked language model (CMLM) and mask-predict decoding (Ghazvininejad et al., 2019), one
model per direction like the teachers: a baseline, and a refiner of REDER's output.

The encoder is the teacher's (reder/autoregressive.py: pre-norm layers, tied embeddings scaled by √D, fixed
sinusoidal positions). The decoder reads the whole target at once, some positions replaced by [MASK] (the
CTC blank's id, never a real piece), without a causal mask, and predicts every position; a length head on the
mean of the encoder states predicts the target length (fairseq's cmlm; the paper uses a LENGTH token).
Training masks n tokens of each target, n uniform in 1..|y|, and scores the masked positions (label-smoothed
cross-entropy) plus `length_loss_factor` × the length's cross-entropy (the objective: reder/objectives/directional.py,
`cmlm_loss`). Targets carry no EOS: the length says where they end.

Mask-predict with T iterations and l length candidates: the l most likely lengths are decoded in parallel;
iteration 0 predicts every position (T = 1 is one parallel pass: the argmax); iteration t = 1..T−1 re-masks
the ⌊N·(T−t)/T⌋ tokens of lowest probability and predicts them again, the others keeping their tokens and
probabilities; the candidate with the best mean token log-probability wins. `refine` starts from a given
hypothesis instead of iteration 0 (its tokens' probabilities from one fully masked pass) and runs k
iterations on the schedule of T = k + 1.
"""
import math

import torch
from torch import nn

from reder.autoregressive import DecoderLayer as CausalDecoderLayer
from reder.autoregressive import EncoderDecoder, KeysValues, log_softmax_fp32
from reder.config import BOS_ID, EOS_ID, PAD_ID, CmlmConfig
from reder.ctc import pad_batch, valid_mask


def remask(scores: torch.Tensor, lengths: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """Mask-predict's re-masking (N, T): the counts[i] lowest-scoring real positions of each row i (ties: the
    earlier position first)."""
    valid = valid_mask(lengths, scores.shape[1])
    ranks = scores.masked_fill(~valid, math.inf).argsort(dim=1, stable=True).argsort(dim=1)  # (N, T)
    return ranks < counts[:, None]


class DecoderLayer(CausalDecoderLayer):
    """The teacher's decoder layer (the same modules) with self-attention over every target position (no causal
    mask, no cache)."""

    def forward(self, x: torch.Tensor, tgt_mask: torch.Tensor, cross: KeysValues, src_mask: torch.Tensor) -> torch.Tensor:
        """x (N, T, D), key masks (N, 1, 1, T) and (N, 1, 1, S), cross: the memory's keys/values → (N, T, D)."""
        h = self.self_norm(x)
        x = x + self.dropout(self.self_attention(h, *self.self_attention.keys_values(h), tgt_mask))
        x = x + self.dropout(self.cross_attention(self.cross_norm(x), *cross, src_mask))
        return x + self.dropout(self.ffn(self.ffn_norm(x)))


class CMLM(EncoderDecoder):
    """Conditional masked language model for one direction (see module doc)."""

    def __init__(self, cfg: CmlmConfig) -> None:
        super().__init__(cfg, DecoderLayer)
        self.banned = [PAD_ID, BOS_ID, EOS_ID, cfg.mask_id]  # never predicted: targets hold real pieces only

    def add_heads(self) -> None:
        self.length = nn.Linear(self.cfg.d_model, self.cfg.max_positions)  # target lengths 0..max_positions−1

    def length_log_probs(self, memory: torch.Tensor, src_mask: torch.Tensor) -> torch.Tensor:
        """Log-probabilities (B, max_positions) of the target length, from the mean of the encoder states."""
        pooled = (memory * src_mask[..., None]).sum(dim=1) / src_mask.sum(dim=1, keepdim=True)  # (B, D)
        return log_softmax_fp32(self.length(pooled))

    def cross(self, memory: torch.Tensor) -> list[KeysValues]:
        """Every decoder layer's keys/values of encoder memory (N, S, D): computed once per decoding."""
        return [layer.cross_attention.keys_values(memory) for layer in self.decoder]

    def decode(self, cross: list[KeysValues], src_mask: torch.Tensor, tokens: torch.Tensor,
               lengths: torch.Tensor) -> torch.Tensor:
        """One decoder pass: target tokens (N, T), some [MASK], the first `lengths` real → logits (N, T, V)."""
        tgt_mask = valid_mask(lengths.clamp(min=1), tokens.shape[1])[:, None, None, :]  # an empty row sees position 0
        x = self._embed(tokens)
        for layer, keys_values in zip(self.decoder, cross):
            x = layer(x, tgt_mask, keys_values, src_mask[:, None, None, :])
        return self.decoder_norm(x) @ self.embed.weight.t()  # the tied output projection

    def decode_log_probs(self, cross: list[KeysValues], src_mask: torch.Tensor, tokens: torch.Tensor,
                         lengths: torch.Tensor) -> torch.Tensor:
        """`decode`'s logits as log-probabilities (N, T, V), in float32 or wider."""
        return log_softmax_fp32(self.decode(cross, src_mask, tokens, lengths))

    def _predict(self, cross: list[KeysValues], src_mask: torch.Tensor, tokens: torch.Tensor,
                 lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Each position's most likely real piece and its log-probability, (N, T) each."""
        log_probs = self.decode_log_probs(cross, src_mask, tokens, lengths)
        log_probs[..., self.banned] = -math.inf
        best, argmax = log_probs.max(dim=-1)
        return best, argmax

    def iterate(self, cross: list[KeysValues], src_mask: torch.Tensor, tokens: torch.Tensor, scores: torch.Tensor,
                lengths: torch.Tensor, iterations: int, start: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """Mask-predict iterations t = start..iterations−1 over N rows of tokens and their log-probabilities
        (N, T): t = 0 predicts every real position; t > 0 re-masks the ⌊N·(T−t)/T⌋ lowest and predicts them."""
        valid = valid_mask(lengths, tokens.shape[1])
        for t in range(start, iterations):
            masked = valid
            if t > 0:
                counts = lengths * (iterations - t) // iterations  # (N,)
                if not bool((counts > 0).any()):
                    break  # the counts only fall: nothing is re-masked any more
                masked = remask(scores, lengths, counts)
            best, argmax = self._predict(cross, src_mask, tokens.masked_fill(masked, self.cfg.mask_id), lengths)
            tokens, scores = torch.where(masked, argmax, tokens), torch.where(masked, best, scores)
        return tokens, scores

    def candidate_lengths(self, memory: torch.Tensor, src_mask: torch.Tensor, length_beam: int) -> torch.Tensor:
        """The `length_beam` most likely target lengths (B, l), most likely first; length 0 is never proposed."""
        log_probs = self.length_log_probs(memory, src_mask)
        log_probs[:, 0] = -math.inf
        return log_probs.topk(min(length_beam, log_probs.shape[1] - 1), dim=1).indices

    def decode_lengths(self, memory: torch.Tensor, src_mask: torch.Tensor, lengths: torch.Tensor,
                       iterations: int) -> list[tuple[list[int], float]]:
        """Mask-predict with `iterations` for every candidate length (B, l); per sentence the candidate with the
        best mean token log-probability (ties: the more likely length) and that mean."""
        batch, beam = lengths.shape
        flat = lengths.reshape(-1)  # (B·l,)
        rows = torch.arange(batch, device=memory.device).repeat_interleave(beam)
        cross, row_mask = self.cross(memory[rows]), src_mask[rows]
        width = int(flat.max())
        tokens = torch.full((batch * beam, width), self.cfg.mask_id, dtype=torch.long, device=memory.device)
        tokens, scores = self.iterate(cross, row_mask, tokens, torch.zeros(tokens.shape, device=memory.device), flat,
                                      iterations)
        mean = (scores * valid_mask(flat, width)).sum(dim=1) / flat  # (B·l,)
        best = mean.view(batch, beam).argmax(dim=1)  # the first of equals
        picked = torch.arange(batch, device=memory.device) * beam + best
        return [(tokens[row, : int(flat[row])].tolist(), float(mean[row])) for row in picked.tolist()]

    @torch.no_grad()
    def mask_predict(self, src_tokens: torch.Tensor, src_lengths: torch.Tensor, iterations: int = 10,
                     length_beam: int = 5) -> list[tuple[list[int], float]]:
        """Mask-predict (see module doc): per sentence the ids (no specials) and their mean log-probability."""
        if iterations < 1 or length_beam < 1:
            raise ValueError(f"iterations and length_beam must be >= 1, got {iterations} and {length_beam}")
        memory, src_mask = self.encode(src_tokens, src_lengths)
        return self.decode_lengths(memory, src_mask, self.candidate_lengths(memory, src_mask, length_beam), iterations)

    @torch.no_grad()
    def refine(self, src_tokens: torch.Tensor, src_lengths: torch.Tensor, hypotheses: list[list[int]],
               steps: int) -> list[list[int]]:
        """`steps` mask-predict iterations from the given hypotheses (ids without specials; their lengths are
        kept), as iterations 1..k of T = k + 1; their tokens' log-probabilities come from one pass with every
        position masked. steps 0 returns them unchanged; an empty hypothesis stays empty."""
        if steps < 0:
            raise ValueError(f"steps must be >= 0, got {steps}")
        if steps == 0:
            return [list(h) for h in hypotheses]
        rows = [i for i, h in enumerate(hypotheses) if h]
        outputs = [list(h) for h in hypotheses]
        if not rows:
            return outputs
        device = src_tokens.device
        index = torch.tensor(rows, device=device)
        memory, src_mask = self.encode(src_tokens[index], src_lengths[index])
        tokens, lengths = pad_batch([hypotheses[i] for i in rows], device)  # (N, T), padded with PAD_ID
        cross = self.cross(memory)
        all_masked = tokens.masked_fill(valid_mask(lengths, tokens.shape[1]), self.cfg.mask_id)
        log_probs = self.decode_log_probs(cross, src_mask, all_masked, lengths)
        scores = log_probs.gather(-1, tokens[..., None]).squeeze(-1)  # (N, T): confidence of the given tokens
        tokens, _ = self.iterate(cross, src_mask, tokens, scores, lengths, steps + 1, start=1)
        for row, sentence, length in zip(rows, tokens.tolist(), lengths.tolist()):
            outputs[row] = sentence[:length]
        return outputs
