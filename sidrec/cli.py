"""``sidrec``: one subcommand per stage, plus ``pipeline`` which runs them as Prefect flows.

Stage subcommands call the stage functions directly (this is what ``dvc.yaml`` runs);
``pipeline`` runs the ``retrain`` flow (ephemeral local Prefect API unless ``PREFECT_API_URL``).
"""

from __future__ import annotations

import functools
import importlib
import inspect
import logging
import os
import threading
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, NamedTuple, cast

import typer
from rich.console import Console
from rich.logging import RichHandler
from rich.table import Table

from sidrec.config import SOURCES, Settings, literal_override, load_settings, save_run_config
from sidrec.distributed import is_main_process, require_one_process
from sidrec.errors import SidrecError
from sidrec.progress import configure_library_bars
from sidrec.stage import STAGES, Stage, StageResult
from sidrec.tracking import Terminated, raise_on_sigterm, tracking_uri

app = typer.Typer(
    help="Generative recommendation with semantic IDs: ingest → validate → split → ...",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
console = Console(stderr=True)
out = Console()

ConfigOpt = Annotated[Path, typer.Option("--config", "-c", help="The configuration file.")]
SetOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--set", "-s", help="Override a key: section.key=value (value is YAML). Repeatable."
    ),
]
SourceOpt = Annotated[str | None, typer.Option(help=f"Ingest source: {', '.join(SOURCES)}.")]
DatasetOpt = Annotated[
    str | None,
    typer.Option(
        help="Dataset name (output folder under data/*/); with --source, default the source's."
    ),
]
InterOpt = Annotated[
    Path | None, typer.Option("--interactions", help="csv source: interactions file.")
]
ItemsOpt = Annotated[Path | None, typer.Option("--items", help="csv source: items file.")]
PathOpt = Annotated[Path | None, typer.Option("--path", help="minionerec source: the data folder.")]
DebugOpt = Annotated[bool, typer.Option("--debug", help="Show tracebacks and debug logs.")]


class Options(NamedTuple):
    """The options every command shares (see :func:`common_options`)."""

    config: Path
    set_: list[str] | None
    source: str | None
    dataset: str | None
    interactions: Path | None
    items: Path | None
    path: Path | None
    debug: bool

    def overrides(self) -> list[str]:
        """``--set`` entries, then the shortcut flags (which win), as ``section.key=value``."""
        flags = {
            "ingest.source": self.source,
            "project.dataset": self.dataset,
            "ingest.interactions": self.interactions,
            "ingest.items": self.items,
            "ingest.path": self.path,
        }
        shortcuts = (literal_override(k, v) for k, v in flags.items() if v is not None)
        return [*(self.set_ or []), *shortcuts]

    def settings(self) -> Settings:
        return load_settings(self.config, self.overrides())


_OPTION_TYPES = (ConfigOpt, SetOpt, SourceOpt, DatasetOpt, InterOpt, ItemsOpt, PathOpt, DebugOpt)
_OPTION_DEFAULTS = (Path("params.yaml"), None, None, None, None, None, None, False)
_OPTION_PARAMS = [
    inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=kind)
    for name, kind, default in zip(Options._fields, _OPTION_TYPES, _OPTION_DEFAULTS, strict=True)
]


def common_options(command: Callable[..., None]) -> Callable[..., None]:
    """Give a command the shared options (--config, --set, the ingest shortcuts, --debug); it
    receives them as ``opts: Options``."""
    own = [
        p for p in inspect.signature(command, eval_str=True).parameters.values() if p.name != "opts"
    ]

    @functools.wraps(command)
    def wrapper(**kwargs: Any) -> None:
        opts = Options(**{name: kwargs.pop(name) for name in Options._fields})
        command(opts=opts, **kwargs)

    wrapper.__signature__ = inspect.Signature([*own, *_OPTION_PARAMS])  # type: ignore[attr-defined]
    return wrapper


def _environment_error(exc: Exception) -> str | None:
    """What went wrong, where the environment rather than the code is at fault: a server that
    cannot be reached (the Prefect API, the MLflow tracking server), or a path the configuration
    names that cannot be read or written (nothing was written, as for other bad input); None for
    any other error."""
    import httpx

    if isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout)):
        try:
            server = str(exc.request.url)
        except RuntimeError:  # raised without its request
            server = "the server"
        return (
            f"cannot reach {server} ({exc}); is the server running? (PREFECT_API_URL / "
            "MLFLOW_TRACKING_URI name the servers)"
        )
    if _lost_connection(exc):  # MLflow gave up on its server after its retries
        return (
            f"the MLflow tracking server {tracking_uri()} stopped answering ({exc}); is it "
            "running? (MLFLOW_TRACKING_URI names it)"
        )
    if isinstance(exc, OSError) and exc.filename is not None:
        return (
            f"{exc.filename}: {exc.strerror} (check the paths of params.yaml and --set: "
            "project.*_dir, ingest.*)"
        )
    return None


def _lost_connection(exc: BaseException) -> bool:
    """An MLflow client error whose request could not reach its server (the requests error
    is the exception MLflow raised while handling)."""
    import requests

    if not type(exc).__module__.startswith("mlflow"):
        return False
    chain: list[BaseException] = []
    link: BaseException | None = exc
    while link is not None and all(link is not e for e in chain):  # a chain may loop
        chain.append(link)
        link = link.__cause__ or link.__context__
    return any(isinstance(e, (requests.ConnectionError, requests.Timeout)) for e in chain)


@contextmanager
def _errors(debug: bool) -> Iterator[None]:
    """Short readable errors and a non-zero exit; the traceback only with --debug."""
    # RichHandler writes to the console's current stderr (no stream bound at setup time)
    logging.basicConfig(
        level=logging.DEBUG if debug else logging.WARNING,
        format="%(name)s: %(message)s",
        handlers=[RichHandler(console=console, show_path=False, show_time=False)],
    )
    configure_library_bars()  # a log file gets plain lines, not carriage-return frames
    level = logging.DEBUG if debug else logging.INFO
    if not is_main_process():  # under accelerate launch the main process tells the story
        level = max(level, logging.WARNING)
    for package in ("sidrec", "tasks", "flows", "models"):
        logging.getLogger(package).setLevel(level)
    if not debug:  # TRL calls transformers APIs that warn about their v6 renames on every step
        warnings.filterwarnings("ignore", category=FutureWarning, module=r"transformers\.")
    if threading.current_thread() is threading.main_thread():
        raise_on_sigterm()  # SIGTERM unwinds like Ctrl-C: nothing half-written, runs KILLED
    try:
        yield
    except SidrecError as exc:
        if debug:
            raise
        console.print(f"[bold red]error:[/] {exc}", highlight=False, markup=True, soft_wrap=True)
        raise typer.Exit(1) from None
    except Terminated:
        console.print("[bold red]terminated[/] (SIGTERM): nothing of the running stage was kept")
        raise typer.Exit(143) from None
    except (KeyboardInterrupt, typer.Exit):
        raise
    except Exception as exc:
        if debug:
            raise
        if (problem := _environment_error(exc)) is not None:  # bad input, not a bug of ours
            console.print(f"[bold red]error:[/] {problem}", highlight=False, soft_wrap=True)
            raise typer.Exit(1) from None
        console.print(
            f"[bold red]unexpected error:[/] {type(exc).__name__}: {exc}\n(run again with --debug for the traceback)",
            highlight=False,
        )
        raise typer.Exit(2) from None


LAUNCHABLE: tuple[Stage, ...] = ("sft", "grpo")
"""The stages that run as several processes under ``accelerate launch`` (sidrec/distributed.py)."""


def _run_stage(stage: Stage, settings: Settings) -> None:
    if stage not in LAUNCHABLE:
        require_one_process(
            f"`sidrec {stage}`", f"only {' and '.join(LAUNCHABLE)} train as several"
        )
    if is_main_process():
        save_run_config(settings, stage)
    module = importlib.import_module(f"tasks.{stage}")
    result = getattr(module, stage)(settings)
    if is_main_process():
        _summary({stage: result})


def _summary(results: dict[str, StageResult]) -> None:
    table = Table(title="sidrec summary")
    table.add_column("stage")
    table.add_column("result")
    for stage, result in results.items():
        table.add_row(stage, result.summary)
    out.print(table)


def _stage_command(stage: Stage, doc: str) -> None:
    def command(opts: Options) -> None:
        with _errors(opts.debug):
            _run_stage(stage, opts.settings())

    command.__doc__ = doc
    app.command(name=stage)(common_options(command))


_stage_command("ingest", "Read the configured source into data/raw/<dataset>/.")
_stage_command(
    "validate", "Great Expectations checks; writes data/validated/<dataset>/ only if they pass."
)
_stage_command("split", "Write train/valid/test samples to data/processed/<dataset>/.")
_stage_command(
    "embed", "Encode item text into data/processed/<dataset>/item_emb.npy (cached by content)."
)
_stage_command(
    "sids", "Train the quantizer and write the collision-free SID map to data/sids/<dataset>/."
)
_stage_command(
    "baselines",
    "Train SASRec and choose EASE and the blend once (artifacts/baselines/<dataset>/), for sft, grpo and evaluate.",
)
_stage_command(
    "sft", "Fine-tune the language model to generate SIDs (artifacts/sft/<dataset>/model)."
)
_stage_command(
    "grpo",
    "Refine the SFT model with GRPO over constrained rollouts (artifacts/grpo/<dataset>/model).",
)
_stage_command(
    "evaluate", "HR/NDCG@K over the full catalog: the SFT and GRPO models and the baselines."
)
_stage_command(
    "register",
    "Log the model to MLflow, register it and promote it to champion if it beats the current one.",
)


@app.command("export-index")
@common_options
def export_index(
    out_path: Annotated[Path, typer.Argument(help="Where to write the MiniOneRec .index.json.")],
    opts: Options,
) -> None:
    """Write the dataset's SID map in MiniOneRec's .index.json format."""
    with _errors(opts.debug):
        from models.sid import read_sid_map, to_minionerec_index
        from sidrec.io import atomic_write_json

        settings = opts.settings()
        sid_map = read_sid_map(settings.paths.sid_map)
        atomic_write_json(out_path, to_minionerec_index(sid_map))
        out.print(f"wrote {len(sid_map):,} SIDs to {out_path}")


@app.command("recommend")
@common_options
def recommend_command(
    user: Annotated[
        str | None, typer.Option("--user", help="A user id (their known history is used).")
    ] = None,
    history: Annotated[
        str | None, typer.Option("--history", help="Item ids, oldest first: ID,ID,...")
    ] = None,
    k: Annotated[int, typer.Option("--k", min=1, help="How many items.")] = 10,
    *,
    opts: Options,
) -> None:
    """Top-K items from the registered champion model for a user or a history."""
    with _errors(opts.debug):
        from transformers.utils import logging as hf_logging

        from models.pyfunc import parse_history
        from sidrec.registry import load_champion
        from tasks.recommend import recommend

        # only the table on the terminal: no download / weight-loading progress bars
        os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
        hf_logging.disable_progress_bar()
        if (user is None) == (history is None):
            raise SidrecError("pass exactly one of --user ID or --history ID,ID,...")
        settings = opts.settings()
        items = parse_history(history) if history is not None else None
        champion = load_champion(settings)
        recs = recommend(settings, user=user, history=items, k=k, champion=champion)
        who = f"user {user}" if user is not None else f"history of {len(items or [])} items"
        table = Table(title=f"{champion.uri} (version {champion.version}) · {who}")
        for column in ("rank", "item_id", "title"):
            table.add_column(column, justify="right" if column == "rank" else "left")
        for row in recs.table.itertuples():
            table.add_row(str(row.rank), str(row.item_id), str(row.title))
        out.print(table)
        if recs.unknown_items:
            dropped = ", ".join(repr(i) for i in recs.unknown_items)
            out.print(f"dropped history items the model does not know: {dropped}")
        if recs.fallback:
            out.print("no known history item: these are the most popular items")


@app.command()
@common_options
def pipeline(
    until: Annotated[str, typer.Option(help=f"Last stage to run: {', '.join(STAGES)}.")] = STAGES[
        -1
    ],
    *,
    opts: Options,
) -> None:
    """Run the stages in order as Prefect flows (cached: unchanged inputs are not recomputed)."""
    with _errors(opts.debug):
        if until not in STAGES:
            raise SidrecError(f"--until must be one of {', '.join(STAGES)}, got {until!r}")
        require_one_process("`sidrec pipeline`")  # before Prefect starts
        opts.settings()  # fail fast on bad config, before starting Prefect
        _quiet_expected_errors(opts.debug)
        from flows.common import start_local_api

        api_ready = start_local_api()  # boots while the stages' libraries import
        try:
            from flows.retrain import retrain
        finally:
            api_ready()  # also on a failed import: the server's exit hook is then in place

        results = retrain(
            config_path=str(opts.config), overrides=opts.overrides(), until=cast(Stage, until)
        )
        _summary(results)


@app.command("automations")
def automations_command(
    notify: Annotated[
        str | None,
        typer.Option(
            "--notify",
            help="Notification block as <block-type>/<name> (`prefect block ls`), e.g. "
            "slack-webhook/sidrec-alerts. Without it the automations fire but notify nobody.",
        ),
    ] = None,
    rejections: Annotated[
        int, typer.Option("--rejections", min=1, help="Alert when the gate rejects N in a row.")
    ] = 3,
    deployment: Annotated[
        list[str] | None,
        typer.Option(
            "--deployment", help="Deployment whose failed runs alert (repeatable; retrain-weekly)."
        ),
    ] = None,
    debug: DebugOpt = False,
) -> None:
    """Create or update the Prefect automations: a failed retrain, N gate rejections in a row."""
    with _errors(debug):
        from flows.automations import (
            DEFAULT_DEPLOYMENTS,
            apply,
            notification_block,
            require_server,
            sidrec_automations,
        )

        url = require_server()
        block = notification_block(notify) if notify else None
        done = apply(
            sidrec_automations(
                notify=block,
                deployments=deployment or list(DEFAULT_DEPLOYMENTS),
                rejections=rejections,
            )
        )
        table = Table(title=f"Prefect automations at {url}")
        for column in ("automation", "fires when", "action", ""):
            table.add_column(column)
        action = f"notify {notify}" if block else "none (no --notify block)"
        for automation, how in done:
            table.add_row(automation.name, automation.description, action, how)
        out.print(table)


class _DropUserErrors(logging.Filter):
    """Prefect logs a failing task's exception with its traceback; for errors we report
    ourselves (bad input/config) the console shows only our message. The API keeps the full log."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not isinstance(exc, SidrecError)


def _quiet_expected_errors(debug: bool) -> None:
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    # the first start of the local Prefect server on a fresh clone (database creation, cold
    # imports) took over Prefect's 20 s default on 2 cores and failed `make run`
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
    if debug:
        return
    import prefect  # noqa: F401  (configures Prefect's logging on import)
    from prefect.logging.handlers import APILogHandler

    for logger in (logging.getLogger(), logging.getLogger("prefect")):
        for handler in logger.handlers:
            if not isinstance(handler, APILogHandler) and not any(
                isinstance(f, _DropUserErrors) for f in handler.filters
            ):
                handler.addFilter(_DropUserErrors())


def main() -> None:  # pragma: no cover - console entry point alias
    app(prog_name="sidrec")


if __name__ == "__main__":  # pragma: no cover
    main()
