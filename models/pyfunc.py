"""The recommender as a servable MLflow pyfunc model.

:class:`Recommender` is the plain object: a fine-tuned model, its tokenizer, the SID map and
the item catalog; ``recommend(histories, k)`` returns the top-K catalog items per history
from :class:`models.recommender.SidRecommender` — the same prompts, constrained beam search
and exclusion of the history's items as the evaluate stage scores.

:class:`SidRecommenderModel` wraps it for MLflow: its artifacts are the model folder, the SID
map, the catalog (item_id, title, popularity) and the generation settings; ``load_context``
builds the :class:`Recommender` once, ``predict`` takes a DataFrame with a ``history`` column
and returns ``item_ids``/``titles``/``scores`` per row, with the unknown history items it
dropped and whether it fell back to popularity. :func:`log_recommender` logs it as code
(``models/pyfunc_entry.py``, MLflow's "models from code": nothing is pickled) with a
signature, an input example, the project packages it imports and pinned requirements, so
``mlflow models serve -m models:/<name>@champion`` can serve it:

    POST /invocations {"dataframe_records": [{"history": ["50", "172"]}], "params": {"k": 5}}
"""

from __future__ import annotations

import json
import logging
import tempfile
from collections.abc import Mapping, Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, NamedTuple

import mlflow.pyfunc
import numpy as np
import pandas as pd
from mlflow.exceptions import MlflowException
from mlflow.protos.databricks_pb2 import INVALID_PARAMETER_VALUE
from mlflow.pyfunc import PythonModel

log = logging.getLogger(__name__)

PROJECT_ROOT = Path(__file__).resolve().parent.parent
CODE_PACKAGES = ("models", "sidrec")
"""Project packages the served model imports (``models.pyfunc`` → ``models.*`` → ``sidrec.errors``)."""
REQUIREMENTS = ("mlflow", "torch", "transformers", "tokenizers", "pandas", "numpy", "pyarrow")
"""Distributions the served model needs, pinned to this environment's versions when logged."""
ARTIFACTS = ("model", "sid_map", "catalog", "generation")
"""Artifact keys: the model folder, ``sid_map.json``, ``catalog.parquet`` (item_id, title and
training interaction count ``popularity``) and ``generation.json`` (:class:`GenerationSettings`)."""


class GenerationSettings(NamedTuple):
    """How the served model generates (saved with it as ``generation.json``)."""

    top_k: int
    """Items returned per history unless a request asks for another ``k``."""
    num_beams: int
    """Beam width of the constrained beam search (raised to ``k`` when a request asks for more)."""
    max_length: int
    """The model's context length (``model.max_length`` at training time)."""
    max_history: int
    """Prompts keep each history's most recent items, as in training (``split.max_history``)."""
    batch_size: int = 16
    """Histories per ``generate`` call."""
    exclude_history: bool = True
    """Never recommend an item of the history the request gives (``evaluate.exclude_seen``)."""

    @classmethod
    def read(cls, path: Path, **overrides: Any) -> GenerationSettings:
        """The settings saved at ``path``, ``overrides`` on top. Keys this code does not know
        (a model saved by a newer sidrec) and missing required keys are refused by name: a
        served model must not silently generate otherwise than it was saved to."""
        saved = {**json.loads(Path(path).read_text()), **overrides}
        unknown = sorted(set(saved) - set(cls._fields))
        missing = [f for f in cls._fields if f not in saved and f not in cls._field_defaults]
        if unknown or missing:
            raise ValueError(
                f"{path}: generation settings this code cannot honour: unknown {unknown}, "
                f"missing {missing}; load the model with the sidrec version that saved it"
            )
        return cls(**saved)


class Recommendations(NamedTuple):
    """Per history, best first."""

    item_ids: list[list[str]]
    titles: list[list[str]]
    scores: list[list[float]]
    """Beam score: the SID's log-probability per generated token; under ``fallback``, the
    log of the item's share of the training interactions (popularity's probability)."""
    unknown_items: list[list[str]]
    """History items the model does not know, dropped from its history (in request order)."""
    fallback: list[bool]
    """True where no history item was known (or none was given): the row holds the most
    popular items, not the model's."""


class Recommender:
    """Item ids and titles from :class:`models.recommender.SidRecommender`, the recommender the
    evaluate stage scores: the served answer for a history is the evaluated ranking."""

    def __init__(
        self,
        *,
        model: Any,
        tokenizer: Any,
        sid_map: Mapping[str, Sequence[int]],
        catalog: pd.DataFrame,
        generation: GenerationSettings,
    ):
        """``catalog``: item_id and title of every item that may be recommended (each must
        have a SID in ``sid_map``) and, optionally, ``popularity``: its training interaction
        count, which ranks the fallback for histories the model knows nothing of (without the
        column: catalog order)."""
        from models.baselines.popularity import Popularity
        from models.recommender import SidRecommender

        self.ranker = SidRecommender(
            model=model,
            tokenizer=tokenizer,
            sid_map=sid_map,
            item_ids=catalog["item_id"].astype(str).tolist(),
            max_length=generation.max_length,
            num_beams=generation.num_beams,
            max_history=generation.max_history,
            batch_size=generation.batch_size,
        )
        self.item_ids = self.ranker.item_ids
        self.titles = catalog["title"].astype(str).tolist()
        self.generation = generation
        counts = (
            catalog["popularity"].to_numpy()
            if "popularity" in catalog.columns
            else np.zeros(len(catalog), dtype=np.int64)
        )
        self.popularity = Popularity.from_counts(item_ids=self.item_ids, counts=counts)

    @classmethod
    def from_files(
        cls,
        *,
        model_dir: Path,
        sid_map: Path,
        catalog: Path,
        generation: Path,
        **overrides: Any,
    ) -> Recommender:
        """Load the artifacts :func:`log_recommender` saves (on the GPU when there is one);
        ``overrides`` replace saved :class:`GenerationSettings` fields (e.g. the promotion
        gate re-scores a champion with today's beam width)."""
        import torch

        from models.lm import load_model_dir
        from models.sid import read_sid_map

        model, tokenizer = load_model_dir(Path(model_dir))
        if torch.cuda.is_available():
            model = model.to("cuda")
        return cls(
            model=model,
            tokenizer=tokenizer,
            sid_map=read_sid_map(Path(sid_map)),
            catalog=pd.read_parquet(catalog),
            generation=GenerationSettings.read(Path(generation), **overrides),
        )

    @property
    def n_items(self) -> int:
        return len(self.item_ids)

    def recommend(
        self, histories: Sequence[Sequence[str]], k: int | None = None
    ) -> Recommendations:
        """Top-``k`` (default ``generation.top_k``) distinct catalog items per history, none of
        them in the history when ``generation.exclude_history`` (fewer when fewer remain).

        History items the model does not know are dropped and named in ``unknown_items``; a
        history left empty (or sent empty) gets the most popular items, flagged ``fallback``.
        One unknown id never fails the request."""
        k = self.generation.top_k if k is None else int(k)
        if not 1 <= k <= self.n_items:  # before any row is ranked: every row asks the same k
            raise ValueError(f"k must be between 1 and the catalog size {self.n_items}, got {k}")
        index = self.ranker.index
        known = [[i for i in map(str, h) if i in index] for h in histories]
        unknown = [[i for i in map(str, h) if i not in index] for h in histories]
        exclude = known if self.generation.exclude_history else None
        rows = np.full((len(known), k), -1, dtype=np.int64)
        scores = np.full((len(known), k), -np.inf)
        model_rows = [r for r, h in enumerate(known) if h]
        if model_rows:
            ranking = self.ranker.rank(
                [known[r] for r in model_rows],
                k,
                exclude=None if exclude is None else [exclude[r] for r in model_rows],
            )
            rows[model_rows], scores[model_rows] = ranking.items, ranking.scores
        fallback = [not h for h in known]
        if any(fallback):
            rows[fallback], scores[fallback] = self.popular(int(sum(fallback)), k)
        if any(unknown):
            log.info(
                "dropped %d unknown history item(s) from %d of %d histories",
                sum(map(len, unknown)),
                sum(1 for u in unknown if u),
                len(known),
            )
        out = Recommendations([], [], [], unknown, fallback)
        for items, row_scores in zip(rows.tolist(), scores.tolist(), strict=True):
            kept = [(i, s) for i, s in zip(items, row_scores, strict=True) if i >= 0]
            out.item_ids.append([self.item_ids[i] for i, _ in kept])
            out.titles.append([self.titles[i] for i, _ in kept])
            out.scores.append([round(float(s), 6) for _, s in kept])
        return out

    def popular(self, n: int, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(n, k) most popular items and their log share of the training interactions (the
        histories are empty: nothing to exclude)."""
        items = self.popularity.recommend(n, min(k, self.n_items))
        counts = self.popularity.counts.astype(np.float64)
        share = (counts + 1.0) / (counts.sum() + len(counts))  # +1: never log(0)
        scores = np.where(items >= 0, np.log(share[items.clip(min=0)]), -np.inf)
        if k > items.shape[1]:
            pad = ((0, 0), (0, k - items.shape[1]))
            items = np.pad(items, pad, constant_values=-1)
            scores = np.pad(scores, pad, constant_values=-np.inf)
        return items, scores


def parse_history(value: Any, row: int = 0) -> list[str]:
    """One ``history`` cell as item ids: a list/array of ids (strings or integers; whole-number
    floats, as JSON clients may send integers, count as integers) or a comma-separated string
    (``"50, 172"``); an empty list or string, a null or a missing cell is an empty history."""
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    if value is None or (np.ndim(value) == 0 and pd.isna(value)):  # None, NaN, pd.NA, NaT
        return []
    if isinstance(value, (list, tuple, np.ndarray)):
        ids = []
        for item in value:
            if isinstance(item, (float, np.floating)) and float(item).is_integer():
                item = int(item)
            if isinstance(item, (str, int, np.integer)) and not isinstance(item, bool):
                ids.append(str(item).strip())
            else:
                raise ValueError(
                    f"history row {row}: item ids must be strings or integers, "
                    f"got {item!r} ({type(item).__name__})"
                )
        return ids
    raise ValueError(
        f"history row {row}: expected a list of item ids or a comma-separated string, "
        f"got {value!r} ({type(value).__name__})"
    )


class SidRecommenderModel(PythonModel):
    """MLflow pyfunc wrapper of :class:`Recommender` (artifacts: :data:`ARTIFACTS`)."""

    def load_context(self, context: Any) -> None:
        paths = context.artifacts
        self.recommender = Recommender.from_files(
            model_dir=Path(paths["model"]),
            sid_map=Path(paths["sid_map"]),
            catalog=Path(paths["catalog"]),
            generation=Path(paths["generation"]),
        )

    def predict(
        self, context: Any, model_input: pd.DataFrame, params: dict[str, Any] | None = None
    ) -> pd.DataFrame:
        """``model_input``: a DataFrame with a ``history`` column (see :func:`parse_history`);
        ``params``: optional ``{"k": int}``. Returns one row per input row with ``item_ids``,
        ``titles`` and ``scores`` (lists, best first), ``unknown_items`` (history items the
        model dropped) and ``fallback`` (true: popularity, no known history item)."""
        frame = model_input if isinstance(model_input, pd.DataFrame) else pd.DataFrame(model_input)
        try:
            if "history" not in frame.columns:
                raise ValueError(
                    f"input needs a 'history' column (item ids), got columns {list(frame.columns)}"
                )
            histories = [parse_history(value, row) for row, value in enumerate(frame["history"])]
            k = (params or {}).get("k")
            recs = self.recommender.recommend(histories, k=None if k is None else int(k))
        except ValueError as exc:
            # a request error: the scoring server answers 400 with this message (any other
            # exception becomes a generic message and a stack trace sent to the client)
            raise MlflowException(str(exc), error_code=INVALID_PARAMETER_VALUE) from None
        return pd.DataFrame(recs._asdict(), index=frame.index)


def model_signature(top_k: int) -> Any:
    """Input ``history`` (any: a list of ids or a comma-separated string, parsed by the model),
    output lists per row, and the request parameter ``k``."""
    from mlflow.models import ModelSignature
    from mlflow.types.schema import (
        AnyType,
        Array,
        ColSpec,
        DataType,
        ParamSchema,
        ParamSpec,
        Schema,
    )

    return ModelSignature(
        inputs=Schema([ColSpec(AnyType(), "history")]),
        outputs=Schema(
            [
                ColSpec(Array(DataType.string), "item_ids"),
                ColSpec(Array(DataType.string), "titles"),
                ColSpec(Array(DataType.double), "scores"),
                ColSpec(Array(DataType.string), "unknown_items"),
                ColSpec(DataType.boolean, "fallback"),
            ]
        ),
        params=ParamSchema([ParamSpec("k", DataType.long, top_k)]),
    )


def pip_requirements() -> list[str]:
    """:data:`REQUIREMENTS` pinned to this environment (local build tags such as ``+cpu`` dropped,
    so a GPU machine installs its own build of the same version)."""
    pins = []
    for name in REQUIREMENTS:
        try:
            pins.append(f"{name}=={version(name).split('+')[0]}")
        except PackageNotFoundError:
            pins.append(name)
    return pins


def log_recommender(
    *,
    name: str,
    model_dir: Path,
    sid_map: Path,
    catalog: pd.DataFrame,
    generation: GenerationSettings,
    example_history: Sequence[str],
) -> Any:
    """Log the recommender as a pyfunc model in the active MLflow run; returns MLflow's
    ``ModelInfo`` (``model_uri``, ``model_id``). MLflow loads it once to check that the input
    example (``example_history``) can be served."""
    with tempfile.TemporaryDirectory(prefix="sidrec-pyfunc-") as tmp:
        staged = Path(tmp)
        catalog_path = staged / "catalog.parquet"
        columns = ["item_id", "title", *(["popularity"] if "popularity" in catalog else [])]
        saved = catalog[columns].astype({"item_id": str, "title": str})
        saved.to_parquet(catalog_path, index=False)
        generation_path = staged / "generation.json"
        generation_path.write_text(json.dumps(generation._asdict(), indent=2))
        return mlflow.pyfunc.log_model(
            name=name,
            python_model=str(Path(__file__).with_name("pyfunc_entry.py")),
            artifacts={
                "model": str(model_dir),
                "sid_map": str(sid_map),
                "catalog": str(catalog_path),
                "generation": str(generation_path),
            },
            code_paths=[str(PROJECT_ROOT / package) for package in CODE_PACKAGES],
            pip_requirements=pip_requirements(),
            signature=model_signature(generation.top_k),
            input_example=(
                pd.DataFrame({"history": [list(example_history)]}),
                {"k": min(3, generation.top_k)},
            ),
        )
