"""Names that become paths, and paths that must stay inside their root.

Jobs, topics, queries, sources, sinks, operators and savepoint ids all end up as a directory or
file name (checkpoint directories, registry entries, topic stores, savepoint ids). They are one
validated type, :class:`Name`, checked wherever a name enters: the API, the command line,
Dagster, and every manifest or registry entry read back from disk. A name is 1–200 ASCII
letters, digits, ``.``, ``_`` or ``-`` and starts with a letter or digit, so it is never ``.``,
``..``, absolute, hidden, or a path with a separator.

:func:`contained` is the other half: a relative path read from a manifest or a mirror is joined
to its root only if the result stays inside the root.
"""

from __future__ import annotations

import re
from pathlib import Path, PurePosixPath

from stateful_runtime.exceptions import ConfigError

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")


class InvalidNameError(ConfigError):
    """A name that would become a path is not a plain name.

    Attributes:
        kind: what the name is for (``job``, ``topic``, ``savepoint id``...).
        value: the rejected value.
    """

    def __init__(self, kind: str, value: object) -> None:
        self.kind, self.value = kind, value
        super().__init__(
            f"{kind} name {value!r} is not allowed: use 1-200 ASCII letters, digits, '.', '_' "
            f"or '-', starting with a letter or digit (names become file and directory names)"
        )


class Name(str):
    """A validated name (a ``str``): ``Name("upi-counts", "sink")``."""

    __slots__ = ()

    def __new__(cls, value: object, kind: str = "name") -> Name:
        if isinstance(value, Name):
            return value
        if not isinstance(value, str) or not _NAME.fullmatch(value):
            raise InvalidNameError(kind, value)
        return super().__new__(cls, value)

    def __reduce__(self) -> tuple[type[Name], tuple[str]]:
        return Name, (str(self),)


def check_name(kind: str, value: object) -> Name:
    """``value`` as a :class:`Name`, or :class:`InvalidNameError` saying what ``kind`` needs."""
    return Name(value, kind)


class PathEscapeError(ConfigError):
    """A relative path read from a manifest, mirror or registry leaves its root."""

    def __init__(self, root: Path | str, relative: str, where: str) -> None:
        self.root, self.relative, self.where = root, relative, where
        super().__init__(
            f"{where} names the path {relative!r}, which leaves {root}: refusing to read or "
            f"write outside it. The file was edited or written by something else; restore it "
            f"from a copy you trust or remove that entry."
        )


def safe_relative(relative: str, *, root: Path | str, where: str) -> PurePosixPath:
    """``relative`` as a normalised relative POSIX path, refused if absolute or if any part is
    ``..``, ``.`` or empty (a manifest of ours never writes such a path)."""
    p = PurePosixPath(relative)
    if (
        not relative
        or p.is_absolute()
        or "\\" in relative
        or "\0" in relative
        or any(part in ("", ".", "..") for part in relative.split("/"))
    ):
        raise PathEscapeError(root, relative, where)
    return p


def contained(root: Path | str, relative: str, *, where: str) -> Path:
    """``root / relative``, refused (:class:`PathEscapeError`) unless it stays inside ``root``,
    symbolic links resolved."""
    base = Path(root)
    target = base / safe_relative(relative, root=root, where=where)
    resolved_root = base.resolve()
    resolved = target.resolve()
    if resolved != resolved_root and resolved_root not in resolved.parents:
        raise PathEscapeError(root, relative, where)
    return target
