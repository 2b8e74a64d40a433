"""The published model as an MLflow pyfunc that translates, both directions behind one model.

MLflow "models from code": `tracking.registry.log_translator` logs this file as the model's code, the model directory
as its artifact `model` and the `reder` package beside it (code_paths), so the logged model needs nothing
of this repository to load — `mlflow.pyfunc.load_model("models:/reder-en-de/1")` or `mlflow models serve
-m models:/reder-en-de/1 --env-manager local`. Loading runs this file, which declares the model with
`mlflow.models.set_model`; nothing else imports it.

Input: rows of `text`, `src`, `tgt` (language codes of the model directory; each row names its own
direction, so one request may mix both); params `beam` (the beam size, 1 = greedy; > 1 with decoder greedy means
beam) and `decoder` (a name of reder/decoding/, as the CLI takes it: greedy, beam; a DAG model's lookahead,
viterbi), `strict` (default false), `scores` (default false). Output: one translation per row, in input
order; with `scores`, one record per row instead, {"translation", "score", "forward", "round_trip", "reason"}: the
model's round-trip confidence in its translation (reder/confidence.py). As `python -m reder.translate`, every row is translated: a control character or line terminator in its
text becomes a space and a text longer than the model reads is cut to it, each logged as a warning naming the
row; with `strict` such a row is refused instead. A row for a language pair the model does not translate, an
empty text or bad params are MLflow's INVALID_PARAMETER_VALUE (HTTP 400 from the scoring server), naming the row.
"""
from __future__ import annotations

import logging

import mlflow
from mlflow.exceptions import MlflowException
from mlflow.protos.databricks_pb2 import INVALID_PARAMETER_VALUE
from mlflow.pyfunc import PythonModel

# from the logged model's own copy of the package (code_paths) when MLflow loads it
from reder.api import load, sentence_problem
from reder.checkpoint import direction_of
from reder.text import normalise

log = logging.getLogger(__name__)


def _bad(message: str) -> MlflowException:
    return MlflowException(message, error_code=INVALID_PARAMETER_VALUE)


class DuplexTranslator(PythonModel):
    _skip_type_hint_validation = True  # the signature is given when it is logged (tracking.registry.log_translator)

    def load_context(self, context):
        self.translator = load(context.artifacts["model"])

    def predict(self, context, model_input, params=None):
        params = params or {}
        beam, decoder = int(params.get("beam", 1)), str(params.get("decoder", "greedy"))
        strict = params.get("strict", False) in (True, "true", "True")
        scores = params.get("scores", False) in (True, "true", "True")
        if beam < 1:
            raise _bad(f"params.beam: must be >= 1, got {beam}")
        rows = model_input.to_dict("records") if hasattr(model_input, "to_dict") else list(model_input)
        groups: dict[tuple[str, str], list[int]] = {}
        for index, row in enumerate(rows):
            missing = [key for key in ("src", "tgt") if not isinstance(row.get(key), str)]
            if missing:
                raise _bad(f"row {index}: {', '.join(missing)} must be a string")
            problem = sentence_problem(row.get("text"), strict)
            if problem:
                raise _bad(f"row {index}: text {problem}")
            row["text"], note = normalise(row["text"])
            if note:
                log.warning("row %d: text %s", index, note)
            pair = (row["src"], row["tgt"])
            try:
                direction_of(self.translator.meta, *pair, "this model")
            except ValueError as error:
                raise _bad(f"row {index}: {error}") from None
            groups.setdefault(pair, []).append(index)
        out: list = [""] * len(rows)
        for (src, tgt), indices in groups.items():
            notes: list[tuple[int, str]] | None = None if strict else []
            try:
                translated = self.translator.translate([rows[i]["text"] for i in indices], src, tgt, beam, decoder,
                                                       notes=notes, scores=scores)
            except ValueError as error:  # an unknown decoder, a strict input longer than the model takes
                raise _bad(f"row {indices[0]}: {error}") from None
            for position, note in notes or []:
                log.warning("row %d: text %s", indices[position], note)
            for i, text in zip(indices, translated):
                out[i] = text
        return out


mlflow.models.set_model(DuplexTranslator())
