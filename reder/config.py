"""Model and loss configuration: frozen dataclasses, saved inside every checkpoint.

`Config.from_dict(values)` and `config.to_dict()` are the one loader of reder/configio.py (unknown keys and
wrong types are errors), which pipeline/config.py uses for the whole pipeline config too.
"""
from dataclasses import dataclass
from typing import Any, Optional

from reder.configio import FieldError, require, round_trip

PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3
DIRECTIONS = ("src2tgt", "tgt2src")
ENDS = {"src2tgt": ("src", "tgt"), "tgt2src": ("tgt", "src")}  # direction → (reading end, writing end)
REVERSE = {"src2tgt": "tgt2src", "tgt2src": "src2tgt"}
HEADS = ("ctc", "dag")
DAG_DPS = ("auto", "torch", "triton")  # model.dag_dp: the DAG loss's DP (reder/dag.py's `dag_dp`)
# Decoding defaults, here (torch-free) so that the pipeline's config reads them without loading the decoders:
CUTOFF_TOP_N = 40  # tokens a frame offers the CTC beam (ctcdecode's cutoff_top_n; the official REDER code uses >= 40)
CUTOFF_PROB = 1.0  # ... and only the most likely of them that reach this cumulative probability (1.0: all)
RERANKERS = ("none", "self", "teacher")  # what reranks the CTC beam's n-best (reder/rerank.py)
RERANK_WEIGHT = 1.0  # w of self-reranking: forward + w · reverse, both per-token log-likelihoods


def check_direction(direction: str) -> None:
    """ValueError unless `direction` is src2tgt or tgt2src."""
    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be one of {DIRECTIONS}, got {direction!r}")


def _blank_id(config: Any) -> int:
    """The CTC blank: the last id of the joint vocabulary, never a real piece, so never generated (with
    head="dag" the same id is the skip token of FBA's laid-out target)."""
    return config.vocab_size - 1


@round_trip
@dataclass(frozen=True)
class ModelConfig:
    """Shape and regularisation of the reversible duplex Transformer (docs/DESIGN.md, "The model")."""

    vocab_size: int = 8000  # includes the CTC blank, which is the last id
    d_model: int = 512  # width of one half of the residual stream; the stream is 2 * d_model
    n_heads: int = 8
    ffn_dim: int = 2048
    layers_per_end: int = 6
    dropout: float = 0.1
    attention_dropout: float = 0.0
    upsample_ratio: int = 2
    # Relative attention (Shaw et al.) sees distances j−i clipped to ±this many *upsampled* positions (±K/upsample_ratio
    # source tokens for CTC): 16 is ±8 tokens at ratio 2. The official REDER code's 1024 is effectively unclipped.
    max_relative_distance: int = 16
    max_positions: int = 1024  # positions of the upsampled input sequence
    share_ends: bool = False  # tie the two ends' layers (embeddings and positions are always shared/own)
    label_smoothing: float = 0.1
    memory_efficient: bool = True  # rebuild activations in backward instead of storing them
    head: str = "ctc"  # output head at both ends: "ctc" or "dag" (docs/MODEL_NOTES.md, "Output heads")
    graph_upsample_ratio: float = 8.0  # λ (head="dag"): a graph has int(λ·(|x|+2)) vertices, |x| without BOS/EOS
    link_heads: int = 4  # heads of the DAG link scorer (head="dag")
    # The DAG loss's DP (head="dag"): torch (reder/dag.py), triton (reder/dag_triton.py, the optional extra; CUDA
    # tensors, or CPU ones under TRITON_INTERPRET=1), auto: triton on CUDA when installed, else torch. The same
    # numbers either way (to float rounding), so not part of the train stage's hash.
    dag_dp: str = "auto"
    blank_id = property(_blank_id)

    def __post_init__(self) -> None:
        _check_transformer(self)
        require(self, ffn_dim=">= 1", layers_per_end=">= 1")
        if not isinstance(self.upsample_ratio, int) or self.upsample_ratio < 1:
            raise FieldError("upsample_ratio", f"must be an int >= 1, got {self.upsample_ratio!r}")
        require(self, max_relative_distance=">= 1")
        if self.head not in HEADS:
            raise FieldError("head", f"must be one of {list(HEADS)}, got {self.head!r}")
        ratio = self.graph_upsample_ratio
        if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or ratio < 1:
            raise FieldError("graph_upsample_ratio", f"must be a number >= 1, got {ratio!r}")
        _check_divides_d_model(self, "link_heads")
        if self.dag_dp not in DAG_DPS:
            raise FieldError("dag_dp", f"must be one of {list(DAG_DPS)}, got {self.dag_dp!r}")
        # Checked after the ratios: an input of EOS alone must fit once upsampled (CTC: r positions; DAG: a
        # graph of int(λ·2) vertices, BOS and EOS).
        ratio_key = "upsample_ratio" if self.head == "ctc" else "graph_upsample_ratio"
        shortest = max(2, self.upsample_ratio if self.head == "ctc" else int(self.graph_upsample_ratio * 2))
        if self.max_positions < shortest:
            raise FieldError("max_positions", f"must be >= {shortest} (an input of EOS alone, upsampled by {ratio_key} "
                             f"({getattr(self, ratio_key)}) for head {self.head!r}), got {self.max_positions!r}",
                             (ratio_key,))


@round_trip
@dataclass(frozen=True)
class TransformerConfig:
    """The autoregressive Transformer (teacher for distillation and AR baseline; reder/autoregressive.py)."""

    vocab_size: int = 8000  # the joint SentencePiece vocabulary, CTC blank (never generated) included as the last id
    d_model: int = 512
    n_heads: int = 8
    ffn_dim: int = 2048
    encoder_layers: int = 6
    decoder_layers: int = 6
    dropout: float = 0.1
    attention_dropout: float = 0.0
    label_smoothing: float = 0.1
    max_positions: int = 1024  # longest source (with EOS) and longest output (with EOS)
    blank_id = property(_blank_id)

    def __post_init__(self) -> None:
        _check_transformer(self)
        if self.d_model % 2:
            raise FieldError("d_model", f"must be even (sinusoidal positions), got {self.d_model!r}")
        require(self, ffn_dim=">= 1", encoder_layers=">= 1", decoder_layers=">= 1", max_positions=">= 2")


@round_trip
@dataclass(frozen=True)
class CmlmConfig(TransformerConfig):
    """The conditional masked language model (reder/cmlm.py): the teacher's encoder–decoder keys (its
    max_positions bounds the source with EOS and the target without), a non-causal decoder, a length head over
    0..max_positions−1 target tokens and the weight of its loss; one model per direction. The [MASK] token is
    the vocabulary's last id (the CTC blank)."""

    length_loss_factor: float = 0.1  # weight of the length prediction's cross-entropy (fairseq's cmlm)
    mask_id = property(_blank_id)

    def __post_init__(self) -> None:
        super().__post_init__()
        require(self, length_loss_factor=">= 0")


@round_trip
@dataclass(frozen=True)
class LossConfig:
    """What REDER trains on: its directions, the auxiliary losses' weights and the steps at which they switch
    on (stage two). The paper's text weights FBA and CC 0.1 each (our defaults); the official code uses 0.5.

    Start steps: `aux_start_step` is the shared one; `fba_start_step` / `cc_start_step`, when set, override it
    for their own loss (the official code has one each). Unset (None, the default) they are aux_start_step,
    so a config or saved run written before they existed means what it meant.

    `directions`: both (the duplex model, the default) or one (a simplex baseline: the same network trained
    one way only; the other direction's terms are absent). FBA and CC still run for a trained direction
    whose weight is > 0, and CC then trains the reverse path through the round trip: a clean simplex
    baseline switches them off (lambda_fba=0, lambda_cc=0)."""

    lambda_fba: float = 0.1
    lambda_cc: float = 0.1
    aux_start_step: int = 0
    fba_start_step: Optional[int] = None  # None: aux_start_step
    cc_start_step: Optional[int] = None  # None: aux_start_step
    directions: tuple[str, ...] = DIRECTIONS  # src2tgt, tgt2src or both
    # Glancing (GLAT; DA-Transformer trains with it): the share of the wrongly predicted aligned tokens glanced
    # into the input, linear from glance_start at step 0 to glance_end at glance_steps, then glance_end
    # (DA-Transformer's default 0.5:0.1@200k is glance_start 0.5, glance_end 0.1, glance_steps 200000).
    glance_start: float = 0.0
    glance_end: float = 0.0
    glance_steps: int = 0
    # CTC: glance blank-aligned frames too (Gu & Kong 2021 glance every position of the alignment), not only the
    # frames whose aligned token is a word piece. DAG: no effect (off-path vertices are never glanced).
    glance_blanks: bool = False
    # NMLA (Shao & Feng 2022, CTC only): from this step on the main term is the bag-of-n-grams loss over CTC's
    # alignments (`nmla_<direction>`, n = nmla_ngram, 1 or 2), plus nmla_ctc_weight × CTC (0: CTC off, as the
    # paper's fine-tuning); None: never (the default). FBA and CC are unchanged.
    nmla_start_step: Optional[int] = None
    nmla_ngram: int = 2
    nmla_ctc_weight: float = 0.0
    # NMLA from this fraction of the run on (0 to 1; None: nmla_start_step decides): the trainer sets nmla_start_step
    # to the update at which its run reaches it, of max_time's seconds when the run is budgeted by time (a step
    # count would be a guess), else of max_steps (pipeline/training/harness.py `Harness`).
    nmla_start_fraction: Optional[float] = None

    def __post_init__(self) -> None:
        require(self, lambda_fba=">= 0", lambda_cc=">= 0", aux_start_step=">= 0", glance_steps=">= 0",
                nmla_ctc_weight=">= 0")
        if not isinstance(self.glance_blanks, bool):
            raise FieldError("glance_blanks", f"must be true or false, got {self.glance_blanks!r}")
        if isinstance(self.nmla_ngram, bool) or self.nmla_ngram not in (1, 2):
            raise FieldError("nmla_ngram", f"must be 1 or 2, got {self.nmla_ngram!r}")
        for key in ("glance_start", "glance_end"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
                raise FieldError(key, f"must be a share from 0 to 1, got {value!r}")
        for key in ("fba_start_step", "cc_start_step", "nmla_start_step"):
            value = getattr(self, key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                unset = "" if key == "nmla_start_step" else " (= aux_start_step)"  # null: never / the shared step
                raise FieldError(key, f"must be an int >= 0 or null{unset}, got {value!r}")
        fraction = self.nmla_start_fraction
        if fraction is not None and (isinstance(fraction, bool) or not isinstance(fraction, (int, float))
                                     or not 0 <= fraction < 1):
            raise FieldError("nmla_start_fraction", f"must be a fraction from 0 up to (not including) 1 or null, "
                                                    f"got {fraction!r}")
        if fraction is not None and self.nmla_start_step is not None:
            raise FieldError("nmla_start_fraction", f"is {fraction!r} and nmla_start_step {self.nmla_start_step!r}: "
                                                    f"NMLA starts at one of them, set the other null")
        if not self.directions or set(self.directions) - set(DIRECTIONS) or len(set(self.directions)) < len(self.directions):
            raise FieldError("directions", f"must be one or both of {list(DIRECTIONS)}, each once, "
                                           f"got {list(self.directions)}")

    def glance_ratio(self, step: int) -> float:
        """The glancing ratio at training step `step` (0: no glancing)."""
        if step >= self.glance_steps:
            return float(self.glance_end)
        return self.glance_start + (self.glance_end - self.glance_start) * step / self.glance_steps

    def nmla(self, step: int) -> bool:
        """Whether the main term is NMLA's at training step `step` (a start given as a fraction of the run: once
        the trainer has set it as a step)."""
        return self.nmla_start_step is not None and step >= self.nmla_start_step

    def uses_nmla(self) -> bool:
        """Whether NMLA starts at some point of the run (by step or by fraction)."""
        return self.nmla_start_step is not None or self.nmla_start_fraction is not None

    def start_step(self, term: str) -> int:
        """The first step at which auxiliary loss `term` ("fba" or "cc") is on."""
        own = {"fba": self.fba_start_step, "cc": self.cc_start_step}[term]
        return self.aux_start_step if own is None else own


def _check_transformer(config: Any) -> None:
    """The checks REDER's and the AR Transformer's configs share: vocabulary, attention heads, regularisation."""
    if config.vocab_size <= 4:
        raise FieldError("vocab_size", f"must be > 4 (pad, unk, bos, eos and the CTC blank), got {config.vocab_size!r}")
    require(config, d_model=">= 1")
    _check_divides_d_model(config, "n_heads")
    require(config, dropout="in [0, 1)", attention_dropout="in [0, 1)", label_smoothing="in [0, 1)")


def _check_divides_d_model(config: Any, key: str) -> None:
    """Attention heads split d_model evenly: `key` must be a positive int dividing it."""
    heads = getattr(config, key)
    if not isinstance(heads, int) or heads < 1 or config.d_model % heads:
        raise FieldError(key, f"must be a positive divisor of d_model ({config.d_model}), got {heads!r}", ("d_model",))
