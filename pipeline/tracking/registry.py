"""The model registry: the published model logged as a pyfunc that translates both ways, and the alias
@champion moved to the version with the better test BLEU."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

TRAIN_DIR_TAG = "duplex.train_dir"  # a registered version's tag: the train stage output its model came from
# A registered version's tags after its evaluation: its test BLEU both ways and the SHA-256 of the test references
ALIAS_TAGS = ("test_bleu_src2tgt", "test_bleu_tgt2src", "test_references_sha256")


def beats(new: dict[str, str], holder: dict[str, str] | None) -> tuple[bool, str]:
    """Whether a version with test scores `new` (ALIAS_TAGS) takes the alias from `holder` (its version tags; None:
    no version holds the alias), and why. The rule (docs/USAGE.md): both directions count, as their mean (the
    sweep's valid_bleu is the same mean); the new version must be strictly better on the same references (a tie
    keeps the holder); a holder without test scores (set by hand) or scored on other references is not beaten:
    it keeps the alias, a person moves it (`mlflow.MlflowClient().set_registered_model_alias`)."""
    def mean(tags: dict[str, str]) -> float:
        return (float(tags[ALIAS_TAGS[0]]) + float(tags[ALIAS_TAGS[1]])) / 2

    ours = f"mean test BLEU {mean(new):.2f} (src2tgt {float(new[ALIAS_TAGS[0]]):.2f}, tgt2src {float(new[ALIAS_TAGS[1]]):.2f})"
    if holder is None:
        return True, f"{ours}; no version held the alias"
    if not all(key in holder for key in ALIAS_TAGS):
        return False, f"has {ours}; the holder has no test scores to compare with"
    if holder[ALIAS_TAGS[2]] != new[ALIAS_TAGS[2]]:
        return False, f"has {ours}, scored on other test references than the holder"
    if mean(new) > mean(holder):
        return True, f"{ours} beats the holder's {mean(holder):.2f}"
    return False, f"has {ours}, not above the holder's {mean(holder):.2f}"


def log_translator(model_dir: Path, languages: tuple[str, str], registered_name: str = "") -> Any:
    """Log a model directory into the active run as an MLflow pyfunc that translates (pipeline/mlflow_model.py,
    the `reder` package beside it), registered as `registered_name` when given; returns MLflow's ModelInfo.
    The input example (a sentence each way) is translated by the logged model as MLflow saves it."""
    import importlib.metadata

    import mlflow
    from mlflow.models import ModelSignature
    from mlflow.types import ColSpec, ParamSchema, ParamSpec, Schema

    import reder

    signature = ModelSignature(inputs=Schema([ColSpec("string", name) for name in ("text", "src", "tgt")]),
                               outputs=Schema([ColSpec("string")]),
                               params=ParamSchema([ParamSpec("beam", "long", 1), ParamSpec("decoder", "string", "greedy"),
                                                   ParamSpec("strict", "boolean", False),
                                                   ParamSpec("scores", "boolean", False)]))
    example = [{"text": "Hello.", "src": src, "tgt": tgt} for src, tgt in (languages, languages[::-1])]
    requirements = [f"{name}=={importlib.metadata.version(name)}" for name in ("torch", "sentencepiece", "mlflow")]
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # a bar per file of a tiny copy
    return mlflow.pyfunc.log_model(name="translator", python_model=str(Path(__file__).parents[1] / "mlflow_model.py"),
                                   artifacts={"model": str(model_dir)}, code_paths=[str(Path(reder.__file__).parent)],
                                   signature=signature, input_example=example, pip_requirements=requirements,
                                   registered_model_name=registered_name or None)
