"""Tiny models and batches shared by the reder tests."""
import torch

from reder import EOS_ID, LossConfig, ModelConfig, REDER


def tiny_config(**overrides) -> ModelConfig:
    values = dict(vocab_size=12, d_model=8, n_heads=2, ffn_dim=16, layers_per_end=2, dropout=0.1,
                  attention_dropout=0.1, upsample_ratio=2, max_relative_distance=3, max_positions=64)
    values.update(overrides)
    return ModelConfig(**values)


def tiny_model(loss_config: LossConfig | None = None, **overrides) -> REDER:
    return REDER(tiny_config(**overrides), loss_config)


def random_batch(lengths: list[int], vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Padded token batch (B, T): real tokens in [4, blank), EOS last, PAD after."""
    tokens = torch.zeros(len(lengths), max(lengths), dtype=torch.long)
    for row, length in enumerate(lengths):
        tokens[row, : length - 1] = torch.randint(4, vocab_size - 1, (length - 1,))
        tokens[row, length - 1] = EOS_ID
    return tokens, torch.tensor(lengths)


def padding_mask(lengths: list[int]) -> torch.Tensor:
    return torch.arange(max(lengths))[None, :] < torch.tensor(lengths)[:, None]
