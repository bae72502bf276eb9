"""Atomic file output and schema-checked tables.

Every stage writes through :class:`AtomicOutputs`: files go to temporary names beside their
targets and are renamed into place only when the whole stage has succeeded, so a failed
run never leaves a half-written artifact or replaces a good one.

A process killed while it writes (SIGKILL, a lost machine) cannot remove its temporary files.
Their names say whose they are (``.<target>.<pid>-<start>-<host hash>.<random>.tmp``, see
sidrec/process.py), and the next write of the same target on the same host removes those of
writers that no longer run; a live writer's are never touched. `.dvcignore` keeps them out of
the DVC outputs they sit in meanwhile.
"""

from __future__ import annotations

import ctypes
import errno
import glob
import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from sidrec import process
from sidrec.errors import InputError

log = logging.getLogger(__name__)


def _process_umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


UMASK = _process_umask()
"""The process's umask, read once at import (reading it means setting it)."""


def open_mode(path: Path) -> None:
    """Give a staged file or folder the mode ``open()`` or ``mkdir()`` would have given it.

    ``mkstemp`` and ``mkdtemp`` create owner-only entries (0600, 0700); published as they are,
    a process of another user (a serving container, a shared DVC cache) could not read them."""
    path.chmod((0o777 if path.is_dir() else 0o666) & ~UMASK)


_HOST_TAG = hashlib.sha256(process.host().encode()).hexdigest()[:8]
_OWNED = re.compile(r"(?P<pid>\d+)-(?P<start>\d+)-(?P<host>[0-9a-f]{8})\.[^.]+")
"""What follows ``.<target>.`` in a staged name, before ``.tmp``: the writer, then mkstemp's
random part (letters, digits, underscores)."""


def _staging_prefix(target: Path) -> str:
    """The prefix of a temporary name for ``target`` in its folder (created if missing), naming
    this process; leftovers of dead writers of ``target`` go first (module doc)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    remove_leftovers(target)
    start = round(process.started() * 100)  # centiseconds: the kernel's resolution
    return f".{target.name}.{os.getpid()}-{start}-{_HOST_TAG}."


def remove_leftovers(target: Path) -> list[Path]:
    """Delete the temporary files and folders of ``target`` that writers on this host left
    when they were killed (their process is gone); returns what was deleted."""
    prefix = f".{target.name}."
    removed = []
    for entry in target.parent.glob(f"{glob.escape(prefix)}*.tmp"):
        owner = _OWNED.fullmatch(entry.name[len(prefix) : -len(".tmp")])
        if owner is None or owner["host"] != _HOST_TAG:
            continue  # not staged by this module, or another host's: its process is unknown
        if process.alive(int(owner["pid"]), int(owner["start"]) / 100):
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
        removed.append(entry)
    if removed:
        log.warning(
            "removed %d leftover(s) of killed writers of %s: %s",
            len(removed),
            target,
            ", ".join(p.name for p in removed),
        )
    return removed


@contextmanager
def atomic_path(target: Path) -> Iterator[Path]:
    """Yield a temporary path beside ``target``; rename it over ``target`` on success."""
    fd, tmp = tempfile.mkstemp(prefix=_staging_prefix(target), suffix=".tmp", dir=target.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        open_mode(tmp_path)
        os.replace(tmp_path, target)
    finally:
        tmp_path.unlink(missing_ok=True)


class AtomicOutputs:
    """Stage several files (or folders), then publish them together.

    >>> with AtomicOutputs() as out:
    ...     out.parquet(df, path_a)
    ...     out.json(metrics, path_b)
    Nothing is visible at ``path_a``/``path_b`` until the block exits without an error. Each
    file (or folder) then replaces its target by a rename, one after the other, so a reader
    never sees a half-written file; a process killed between two renames (a window of
    microseconds) leaves whole files of two runs side by side, and its stage unrecorded (no
    Prefect cache entry, no dvc.lock entry): the next run redoes that stage.
    """

    def __init__(self) -> None:
        self._staged: list[tuple[Path, Path]] = []

    def __enter__(self) -> AtomicOutputs:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        try:
            if exc_type is None:
                for tmp, target in self._staged:
                    if tmp.is_dir():
                        replace_dir(tmp, target)
                    else:
                        open_mode(tmp)
                        os.replace(tmp, target)
        finally:
            for tmp, _ in self._staged:
                if tmp.is_dir():
                    shutil.rmtree(tmp, ignore_errors=True)
                else:
                    tmp.unlink(missing_ok=True)

    def stage(self, target: Path, write: Callable[[Path], None]) -> None:
        fd, tmp = tempfile.mkstemp(prefix=_staging_prefix(target), suffix=".tmp", dir=target.parent)
        os.close(fd)
        self._staged.append((Path(tmp), target))
        write(Path(tmp))

    def folder(self, target: Path, write: Callable[[Path], None]) -> None:
        """Stage a whole folder: ``write`` fills an empty temporary folder beside ``target``,
        which replaces ``target`` (and everything in it) on success."""
        tmp = staging_dir(target)
        self._staged.append((tmp, target))
        write(tmp)

    def parquet(self, df: pd.DataFrame, target: Path, schema: pa.Schema | None = None) -> None:
        table = (
            to_arrow(df, schema, target)
            if schema is not None
            else pa.Table.from_pandas(df, preserve_index=False)
        )
        self.stage(target, lambda tmp: pq.write_table(table, tmp))

    def json(self, obj: Any, target: Path) -> None:
        text = dumps(obj)

        def write(tmp: Path) -> None:
            tmp.write_text(text)

        self.stage(target, write)


def staging_dir(target: Path) -> Path:
    """An empty folder beside ``target`` to build its replacement in (see :func:`replace_dir`),
    named for this process like every staged output, so a killed writer's is swept later."""
    return Path(tempfile.mkdtemp(prefix=_staging_prefix(target), suffix=".tmp", dir=target.parent))


def replace_dir(source: Path, target: Path) -> None:
    """Move the complete folder ``source`` to ``target``, replacing what was there.

    Where the kernel and filesystem can (Linux ``renameat2`` with ``RENAME_EXCHANGE``: ext4,
    xfs, btrfs, tmpfs, overlayfs) the two are swapped in one step, so a reader or a process
    killed at any moment finds ``target`` whole, old or new, never missing; the old folder,
    now at ``source``, is deleted after. Elsewhere the old folder is first moved aside, which
    leaves ``target`` missing for the microseconds between two renames."""
    open_mode(source)
    try:
        if _exchange(source, target):
            shutil.rmtree(source, ignore_errors=True)
            return
    except FileNotFoundError:
        if not source.exists():
            raise
        source.rename(target)  # nothing to replace (or it went meanwhile)
        return
    old = target.with_name(f".{target.name}.old")
    shutil.rmtree(old, ignore_errors=True)
    if target.exists():
        target.rename(old)
    source.rename(target)
    shutil.rmtree(old, ignore_errors=True)


_AT_FDCWD = -100
_RENAME_EXCHANGE = 2
_CANNOT_EXCHANGE = {errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.EXDEV, errno.EPERM}
"""Errors that say this kernel or filesystem cannot swap these two paths (not that they are
wrong): the caller falls back to two renames."""


def _libc_renameat2() -> Any:
    try:
        function = ctypes.CDLL(None, use_errno=True).renameat2  # glibc >= 2.28, musl >= 1.2.4
    except (AttributeError, OSError):
        return None
    path, dirfd = ctypes.c_char_p, ctypes.c_int
    function.argtypes = [dirfd, path, dirfd, path, ctypes.c_uint]
    function.restype = ctypes.c_int
    return function


_RENAMEAT2 = _libc_renameat2()


def _exchange(a: Path, b: Path) -> bool:
    """Swap two existing paths atomically; False where that cannot be done here.
    FileNotFoundError when either is missing."""
    if _RENAMEAT2 is None:
        return False
    if _RENAMEAT2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in _CANNOT_EXCHANGE:
        return False
    raise OSError(code, os.strerror(code), str(a), None, str(b))


def dumps(obj: Any) -> str:
    return json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n"


def atomic_write_text(target: Path, text: str) -> None:
    with atomic_path(target) as tmp:
        tmp.write_text(text)


def atomic_write_json(target: Path, obj: Any) -> None:
    atomic_write_text(target, dumps(obj))


def read_json(path: Path, what: str, missing_hint: str) -> Any:
    """A JSON file's content; a clear :class:`InputError` naming ``what`` when it is missing
    (with ``missing_hint``, e.g. which command writes it) or not valid JSON."""
    if not path.exists():
        raise InputError(f"{what} not found; {missing_hint}", path=path)
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InputError(f"{what} is not valid JSON ({exc})", path=path) from None


def to_arrow(df: pd.DataFrame, schema: pa.Schema, path: Path | str) -> pa.Table:
    """``df`` as an Arrow table: ``schema``'s columns first, cast to their declared types,
    then any extra columns. Internal invariant: stages build conforming frames."""
    missing = [f.name for f in schema if f.name not in df.columns]
    assert not missing, f"{path}: stage produced no column(s) {missing}"
    extra = [c for c in df.columns if c not in schema.names]
    table = pa.Table.from_pandas(df[[*schema.names, *extra]], preserve_index=False)
    fields = [
        schema.field(n) if n in schema.names else table.schema.field(n) for n in table.column_names
    ]
    return table.cast(pa.schema(fields))


def read_table(path: Path, schema: pa.Schema, what: str) -> pd.DataFrame:
    """Read a stage output and check it against its declared schema."""
    if not path.exists():
        raise InputError(f"{what} not found; run the stage that writes it first", path=path)
    try:
        table = pq.read_table(path)
    except (pa.ArrowInvalid, OSError) as exc:
        raise InputError(f"{what} is not a readable Parquet file ({exc})", path=path) from None
    for field in schema:
        if field.name not in table.column_names:
            raise InputError(f"{what} has no column '{field.name}'", path=path, column=field.name)
        actual = table.schema.field(field.name).type
        if not _compatible(actual, field.type):
            raise InputError(
                f"{what} column has type {actual}, expected {field.type} (or the same values "
                "in another Arrow layout: large or dictionary-encoded strings, large lists); "
                "re-run the stage that writes it",
                path=path,
                column=field.name,
            )
    return to_pandas(table)


def _compatible(actual: pa.DataType, expected: pa.DataType) -> bool:
    """Whether ``actual`` holds ``expected``'s values in another layout: strings plain, large,
    viewed or dictionary-encoded, lists with 32- or 64-bit offsets (a split's ``history``
    written as ``list<string>`` before it was dictionary-encoded reads the same)."""
    if actual == expected:
        return True
    actual, expected = _decoded(actual), _decoded(expected)
    strings = (pa.string(), pa.large_string(), pa.string_view())
    if expected in strings:
        return actual in strings
    if pa.types.is_list(expected) or pa.types.is_large_list(expected):
        return (pa.types.is_list(actual) or pa.types.is_large_list(actual)) and _compatible(
            actual.value_type, expected.value_type
        )
    return actual == expected


def _decoded(type_: pa.DataType) -> pa.DataType:
    return type_.value_type if pa.types.is_dictionary(type_) else type_


def to_pandas(table: pa.Table) -> pd.DataFrame:
    """``table.to_pandas()``, where each cell of a list-of-dictionary column (a split's
    ``history``) is, as there, a numpy object array of its strings, but built from the codes:
    Arrow first decodes every entry to a string of its own (reading the splits of MovieLens-1M
    at 200 history items, 1.2 · 10^8 entries: 11.3 s and 5.0 GB at peak, against 6.1 s and
    2.3 GB here). Each distinct string is one Python object; the cells of a column chunk are
    read-only views of one array of them (a reader copies a history to change it, as
    ``list(h)`` does)."""
    coded = [f.name for f in table.schema if _coded_list(f.type)]
    frame = table.drop_columns(coded).to_pandas()
    for name in coded:
        frame.insert(table.column_names.index(name), name, _coded_cells(table.column(name)))
    return frame


def _coded_list(type_: pa.DataType) -> bool:
    return (pa.types.is_list(type_) or pa.types.is_large_list(type_)) and pa.types.is_dictionary(
        type_.value_type
    )


def _coded_cells(column: pa.ChunkedArray) -> np.ndarray:
    cells = np.empty(len(column), dtype=object)
    start = 0
    for chunk in column.chunks:
        end = start + len(chunk)
        entries = chunk.values
        if chunk.null_count or entries.null_count or not len(chunk):
            cells[start:end] = chunk.to_pandas().to_numpy()  # Arrow's own way: None for nulls
        else:
            offsets = chunk.offsets.to_numpy()
            strings = entries.dictionary.to_numpy(zero_copy_only=False)
            flat = strings[entries.indices.to_numpy()[offsets[0] : offsets[-1]]]
            flat.flags.writeable = False  # shared by every cell: none may change the others
            bounds = offsets - offsets[0]
            for row in range(len(chunk)):
                cells[start + row] = flat[bounds[row] : bounds[row + 1]]
        start = end
    return cells


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
