"""Where checkpoints, savepoints and checkpoint mirrors live: a local directory or S3 (through
boto3).

One small interface, :class:`Store`, over keys relative to a root: put a file, put bytes (with
create-only semantics for commit points), read, list, delete. ``open_store("s3://bucket/prefix")``
gives an :class:`S3Store`, anything else a :class:`LocalStore`.

A checkpoint directory on S3 (``checkpoint.dir=s3://bucket/prefix``) is an :class:`S3Path`: a
:class:`pathlib.Path` whose reads, writes and listings are S3 requests, so the one code that
reads and writes a checkpoint serves both (:func:`checkpoint_path` makes either). An object
appears whole or not at all, so a write needs no temporary file; there is no rename (a move is
a copy and a delete) and no lock file (:mod:`~stateful_runtime.checkpoints.layout` leases the
job's lock with conditional writes instead). Anything else asked of the operating system
(``os.replace``, ``open``, ``fcntl``) refuses an :class:`S3Path` by name rather than creating a
local directory called ``s3:``.

S3 settings come from boto3's own configuration (``AWS_ACCESS_KEY_ID``, ``AWS_REGION``,
``AWS_ENDPOINT_URL`` for an S3-compatible endpoint such as MinIO, SeaweedFS or moto, profiles);
``SRT_S3_ENDPOINT_URL`` overrides the endpoint for the runtime only. Large files go up in
multipart uploads (boto3's transfer manager, 8 MiB parts).
"""

from __future__ import annotations

import contextlib
import fnmatch
import io
import os
import shutil
import stat as stat_
import tempfile
import threading
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path, PosixPath, PurePosixPath
from typing import Any

from stateful_runtime.exceptions import AlreadyExistsError, ConfigError, StorageError
from stateful_runtime.names import contained

MULTIPART_THRESHOLD = 8 * 1024 * 1024


@dataclass(frozen=True)
class StoredObject:
    key: str
    size: int
    mtime: float


class Store(ABC):
    """Objects under one root, addressed by ``/``-separated keys."""

    url: str

    @abstractmethod
    def put_file(self, local: Path, key: str) -> None: ...

    @abstractmethod
    def put_bytes(self, key: str, data: bytes, *, create_only: bool = False) -> None:
        """Write ``data``; with ``create_only``, raise :class:`AlreadyExistsError` if ``key`` exists
        (atomically: the commit point of a savepoint)."""

    @abstractmethod
    def get_bytes(self, key: str) -> bytes: ...

    @abstractmethod
    def get_file(self, key: str, local: Path) -> None: ...

    @abstractmethod
    def list(self, prefix: str = "") -> Iterator[StoredObject]:
        """Every object whose key starts with ``prefix``."""

    @abstractmethod
    def delete(self, keys: Sequence[str]) -> None: ...

    def children(self) -> set[str]:
        """First path component of every key (the savepoints under a savepoint root)."""
        return {o.key.split("/", 1)[0] for o in self.list() if "/" in o.key}

    def join(self, *parts: str) -> str:
        return "/".join([self.url.rstrip("/"), *parts])


class LocalStore(Store):
    def __init__(self, root: str | Path) -> None:
        self.root = Path(root).expanduser().resolve()
        self.url = str(self.root)

    def _path(self, key: str) -> Path:
        """The file of ``key`` (``""`` or a ``prefix/``: the root or a directory), never
        outside the root."""
        rel = key.rstrip("/")
        return contained(self.root, rel, where=f"store key {key!r}") if rel else self.root

    def put_file(self, local: Path, key: str) -> None:
        dest = self._path(key)
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(f".{dest.name}.{os.getpid()}.part")
        shutil.copyfile(local, tmp)
        os.replace(tmp, dest)

    def put_bytes(self, key: str, data: bytes, *, create_only: bool = False) -> None:
        dest = self._path(key)
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(f".{dest.name}.{os.getpid()}.part")
        tmp.write_bytes(data)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        if create_only:
            try:
                os.link(tmp, dest)  # atomic create-if-absent
            except FileExistsError:
                raise AlreadyExistsError(f"{dest} already exists") from None
            finally:
                tmp.unlink()
        else:
            os.replace(tmp, dest)

    def get_bytes(self, key: str) -> bytes:
        try:
            return self._path(key).read_bytes()
        except FileNotFoundError:
            raise StorageError(f"{self._path(key)} does not exist") from None

    def get_file(self, key: str, local: Path) -> None:
        local.parent.mkdir(parents=True, exist_ok=True)
        try:
            shutil.copyfile(self._path(key), local)
        except FileNotFoundError:
            raise StorageError(f"{self._path(key)} does not exist") from None

    def list(self, prefix: str = "") -> Iterator[StoredObject]:
        base = self._path(prefix)
        start = base if base.is_dir() or base == self.root else base.parent
        if not start.is_dir():
            return
        for path in start.rglob("*"):
            if path.is_file() and not path.name.endswith(".part"):
                key = path.relative_to(self.root).as_posix()
                if key.startswith(prefix):
                    st = path.stat()
                    yield StoredObject(key, st.st_size, st.st_mtime)

    def delete(self, keys: Sequence[str]) -> None:
        for key in keys:
            self._path(key).unlink(missing_ok=True)
        # Drop directories the deletes emptied.
        for d in sorted({self._path(k).parent for k in keys}, key=lambda p: -len(p.parts)):
            while d != self.root and d.is_dir() and not any(d.iterdir()):
                d.rmdir()
                d = d.parent


def s3_endpoint() -> str | None:
    """The S3 endpoint the runtime talks to (None: AWS's own, by region)."""
    return os.environ.get("SRT_S3_ENDPOINT_URL") or os.environ.get("AWS_ENDPOINT_URL") or None


_clients: dict[int, Any] = {}
_clients_lock = threading.Lock()


def _shared_client() -> Any:
    """One client per process (boto3 clients are thread-safe; making one costs ~50 ms), made
    again in a forked child."""
    with _clients_lock:
        client = _clients.get(os.getpid())
        if client is None:
            import boto3

            client = _clients[os.getpid()] = boto3.client("s3", endpoint_url=s3_endpoint())
        return client


class S3Store(Store):
    """Objects under ``s3://bucket/prefix``: an :class:`S3Path` makes the requests."""

    def __init__(self, url: str) -> None:
        rest = url.removeprefix(S3_SCHEME).strip("/")
        self.bucket, _, prefix = rest.partition("/")
        if not self.bucket:
            raise ConfigError(f"{url!r} names no bucket; write s3://bucket/prefix")
        self.prefix = prefix
        self.root = S3Path(S3_SCHEME + rest)
        self.url = str(self.root)

    def put_file(self, local: Path, key: str) -> None:
        (self.root / key).upload(local)

    def put_bytes(self, key: str, data: bytes, *, create_only: bool = False) -> None:
        (self.root / key).write_bytes(data, create_only=create_only)

    def get_bytes(self, key: str) -> bytes:
        try:
            return (self.root / key).read_bytes()
        except FileNotFoundError as exc:
            raise StorageError(str(exc)) from None

    def get_file(self, key: str, local: Path) -> None:
        try:
            (self.root / key).download(local)
        except FileNotFoundError as exc:
            raise StorageError(str(exc)) from None

    def list(self, prefix: str = "") -> Iterator[StoredObject]:
        for o in self.root.objects(prefix):
            yield StoredObject(o["Name"], o["Size"], o["LastModified"].timestamp())

    def delete(self, keys: Sequence[str]) -> None:
        self.root.delete_objects(keys)


S3_SCHEME = "s3://"


def is_s3(location: str | os.PathLike[str]) -> bool:
    return isinstance(location, S3Path) or str(location).startswith(S3_SCHEME)


def checkpoint_path(location: str | os.PathLike[str]) -> Path:
    """A checkpoint location as a path: an :class:`S3Path` for ``s3://bucket/prefix``, else a
    local :class:`~pathlib.Path`."""
    if isinstance(location, Path):
        return location
    text = str(location)
    if text.startswith(S3_SCHEME):
        path = S3Path(text)
        if not path.bucket or not path.key:
            raise ConfigError(
                f"{text!r} names no bucket and prefix; write s3://bucket/prefix (a checkpoint "
                f"is a prefix inside a bucket)"
            )
        return path
    if "://" in text:
        raise ConfigError(
            f"unsupported checkpoint location {text!r}: use a local path or s3://bucket/prefix"
        )
    return Path(text)


def s3a_url(path: Path) -> str:
    """What Spark's Hadoop filesystem calls ``path`` (S3A's scheme for an :class:`S3Path`)."""
    return "s3a://" + str(path).removeprefix(S3_SCHEME) if isinstance(path, S3Path) else str(path)


class _Upload(io.BytesIO):
    """What ``S3Path.open("wb")`` returns: the object is written, whole, when it is closed."""

    def __init__(self, path: S3Path) -> None:
        super().__init__()
        self._path = path

    def close(self) -> None:
        if not self.closed:
            self._path.write_bytes(self.getvalue())
        super().close()


class S3Path(PosixPath):
    """``s3://bucket/key`` as a :class:`~pathlib.Path` (parts ``/bucket/key...``): joining,
    names and parents as for any path; reads, writes, listings and stats are S3 requests
    (directories are key prefixes: one exists while an object lies under it)."""

    def __new__(cls, *args: Any) -> S3Path:
        parts = [
            "/" + a.removeprefix(S3_SCHEME) if isinstance(a, str) and a.startswith(S3_SCHEME) else a
            for a in args
        ]
        return cls._from_parts(parts)  # type: ignore[attr-defined,no-any-return]

    # -- names -------------------------------------------------------------------------------
    def __str__(self) -> str:
        text = PurePosixPath(*self.parts).as_posix()
        return "s3:/" + text if self.is_absolute() else text

    def __repr__(self) -> str:
        return f"S3Path({str(self)!r})"

    def __fspath__(self) -> str:
        raise StorageError(
            f"{self} is on S3: this operation needs a local file and is not supported for a "
            f"checkpoint on S3"
        )

    def as_uri(self) -> str:
        return str(self)

    def resolve(self, strict: bool = False) -> S3Path:
        return self

    def absolute(self) -> S3Path:
        return self

    def expanduser(self) -> S3Path:
        return self

    @property
    def bucket(self) -> str:
        return self.parts[1] if len(self.parts) > 1 else ""

    @property
    def key(self) -> str:
        return "/".join(self.parts[2:])

    def _call(self, what: str, fn: Any, **kwargs: Any) -> Any:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return fn(Bucket=self.bucket, **kwargs)
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            if code in ("404", "NoSuchKey", "NotFound"):
                raise FileNotFoundError(f"{self} does not exist") from None
            if code in ("PreconditionFailed", "ConditionalRequestConflict"):
                raise AlreadyExistsError(f"{self} already exists") from None
            hint = f"; create the bucket {self.bucket!r} first" if code == "NoSuchBucket" else ""
            raise StorageError(f"{self}: {what} failed: {code or exc}{hint}") from None
        except BotoCoreError as exc:
            raise StorageError(
                f"{self}: {what} failed: {exc}. Check AWS credentials and the endpoint "
                f"(AWS_ENDPOINT_URL or SRT_S3_ENDPOINT_URL)"
            ) from None

    # -- listing -----------------------------------------------------------------------------
    def objects(self, prefix: str = "", *, delimiter: bool = False) -> list[dict[str, Any]]:
        """The objects whose keys start with this directory's and then ``prefix`` (S3's
        listing entries, each with ``Name``: its key relative to this directory); with
        ``delimiter``, one level only, sub-directories as ``{"Name": name, "Dir": True}``."""
        base = f"{self.key}/" if self.key else ""
        kwargs: dict[str, Any] = {"Prefix": base + prefix}
        if delimiter:
            kwargs["Delimiter"] = "/"
        out: list[dict[str, Any]] = []
        paginator = _shared_client().get_paginator("list_objects_v2")
        pages = self._call(
            "listing", lambda Bucket: list(paginator.paginate(Bucket=Bucket, **kwargs))
        )
        for page in pages:
            for d in page.get("CommonPrefixes", []):
                out.append({"Name": d["Prefix"][len(base) :].rstrip("/"), "Dir": True})
            for o in page.get("Contents", []):
                out.append({**o, "Name": o["Key"][len(base) :]})
        return out

    def delete_objects(self, names: Sequence[str]) -> None:
        """Delete the objects of these keys relative to this directory, 1,000 a request."""
        base = f"{self.key}/" if self.key else ""
        for i in range(0, len(names), 1000):
            self._call(
                "delete",
                _shared_client().delete_objects,
                Delete={"Objects": [{"Key": base + n} for n in names[i : i + 1000]], "Quiet": True},
            )

    def iterdir(self) -> Generator[S3Path, None, None]:
        # An empty directory and a missing one are the same on S3: neither has an entry.
        for name in sorted({o["Name"] for o in self.objects(delimiter=True) if o["Name"]}):
            yield self / name

    def _below(self) -> set[str]:
        """Every object and directory below this one, relative to it."""
        out: set[str] = set()
        for o in self.objects():
            parts = o["Name"].rstrip("/").split("/")
            for i in range(1, len(parts) + 1):
                out.add("/".join(parts[:i]))
        out.discard("")
        return out

    def glob(self, pattern: str) -> Iterator[S3Path]:  # type: ignore[override]
        want = pattern.split("/")
        for rel in sorted(self._below()):
            got = rel.split("/")
            if "**" in want:
                i = want.index("**")
                head, tail = want[:i], want[i + 1 :]
                if len(got) < len(head) + len(tail):
                    continue
                ok = all(map(fnmatch.fnmatchcase, got[: len(head)], head)) and all(
                    map(fnmatch.fnmatchcase, got[len(got) - len(tail) :], tail)
                )
            else:
                ok = len(got) == len(want) and all(map(fnmatch.fnmatchcase, got, want))
            if ok:
                yield self / rel

    def rglob(self, pattern: str) -> Iterator[S3Path]:  # type: ignore[override]
        return self.glob(f"**/{pattern}")

    # -- one object --------------------------------------------------------------------------
    def stat(self, *, follow_symlinks: bool = True) -> os.stat_result:
        try:
            head = self._call("stat", _shared_client().head_object, Key=self.key)
        except FileNotFoundError:
            if self.is_dir():
                return os.stat_result((stat_.S_IFDIR | 0o755, 0, 0, 0, 0, 0, 0, 0, 0, 0))
            raise
        mtime = head["LastModified"].timestamp()
        size = head["ContentLength"]
        return os.stat_result((stat_.S_IFREG | 0o644, 0, 0, 1, 0, 0, size, mtime, mtime, mtime))

    def exists(self) -> bool:
        return self.is_file() or self.is_dir()

    def is_file(self) -> bool:
        if not self.key:
            return False
        try:
            self._call("stat", _shared_client().head_object, Key=self.key)
        except FileNotFoundError:
            return False
        return True

    def is_dir(self) -> bool:
        if not self.key:
            return True
        prefix = f"{self.key}/"
        got = self._call("listing", _shared_client().list_objects_v2, Prefix=prefix, MaxKeys=1)
        return bool(got.get("KeyCount"))

    def read_bytes(self) -> bytes:
        return self.read_versioned()[0]

    def read_versioned(self) -> tuple[bytes, str]:
        """The object's bytes and its ETag (what :meth:`put` can be made conditional on)."""
        got = self._call("read", _shared_client().get_object, Key=self.key)
        return got["Body"].read(), got["ETag"]

    def read_text(self, encoding: str | None = None, errors: str | None = None) -> str:
        return self.read_bytes().decode(encoding or "utf-8", errors or "strict")

    def write_bytes(self, data: Any, *, create_only: bool = False) -> int:  # type: ignore[override]
        body = bytes(data)
        self.put(body, create_only=create_only)
        return len(body)

    def put(self, data: bytes, *, create_only: bool = False, if_match: str | None = None) -> str:
        """Write the object whole; returns its ETag. ``create_only``: only if there is none;
        ``if_match``: only over the object of that ETag (both :class:`AlreadyExistsError`
        otherwise: S3's conditional writes)."""
        extra: dict[str, str] = {"IfNoneMatch": "*"} if create_only else {}
        if if_match is not None:
            extra["IfMatch"] = if_match
        put = self._call("write", _shared_client().put_object, Key=self.key, Body=data, **extra)
        return str(put["ETag"])

    def write_text(  # type: ignore[override]
        self,
        data: str,
        encoding: str | None = None,
        errors: str | None = None,
        newline: str | None = None,
    ) -> int:
        return self.write_bytes(data.encode(encoding or "utf-8", errors or "strict"))

    def upload(self, local: Path) -> None:
        """Write the object from the local file ``local`` (multipart when large)."""
        from boto3.s3.transfer import TransferConfig

        config = TransferConfig(
            multipart_threshold=MULTIPART_THRESHOLD, multipart_chunksize=MULTIPART_THRESHOLD
        )
        self._call(
            "upload",
            lambda Bucket: _shared_client().upload_file(
                Filename=str(local), Bucket=Bucket, Key=self.key, Config=config
            ),
        )

    def download(self, local: Path) -> None:
        """Copy the object into the local file ``local``."""
        local.parent.mkdir(parents=True, exist_ok=True)
        self._call(
            "download",
            lambda Bucket: _shared_client().download_file(
                Bucket=Bucket, Key=self.key, Filename=str(local)
            ),
        )

    def open(  # type: ignore[override]
        self,
        mode: str = "r",
        buffering: int = -1,
        encoding: str | None = None,
        errors: str | None = None,
        newline: str | None = None,
    ) -> Any:
        if "r" in mode:
            data = io.BytesIO(self.read_bytes())
            return data if "b" in mode else io.TextIOWrapper(data, encoding or "utf-8")
        if "w" in mode:
            upload = _Upload(self)
            return upload if "b" in mode else io.TextIOWrapper(upload, encoding or "utf-8")
        raise StorageError(f"{self}: mode {mode!r} is not supported on S3")

    def touch(self, mode: int = 0o666, exist_ok: bool = True) -> None:
        if not self.is_file():
            self.write_bytes(b"")
        elif not exist_ok:
            raise FileExistsError(f"{self} exists")

    def unlink(self, missing_ok: bool = False) -> None:
        if not missing_ok and not self.is_file():
            raise FileNotFoundError(f"{self} does not exist")
        self._call("delete", _shared_client().delete_object, Key=self.key)

    def mkdir(self, mode: int = 0o777, parents: bool = False, exist_ok: bool = False) -> None:
        """Nothing to make: a directory exists while an object lies under it."""
        if not exist_ok and self.is_dir():
            raise FileExistsError(f"{self} exists")

    def rmdir(self) -> None:
        if any(o["Name"] for o in self.objects(delimiter=True)):
            raise OSError(f"{self} is not empty")

    def replace(self, target: str | os.PathLike[str]) -> S3Path:  # type: ignore[override]
        """A copy and a delete: not atomic (S3 has no rename)."""
        dest = target if isinstance(target, S3Path) else S3Path(str(target))
        if not self.is_file():  # a directory: each object below it
            markers = []  # S3A's empty "directory/" objects: dropped, never moved
            for o in self.objects():
                if not o["Name"] or o["Name"].endswith("/"):
                    markers.append(o["Name"])
                else:
                    (self / o["Name"]).replace(dest / o["Name"])
            self.delete_objects(markers)
            return dest
        if dest.bucket == self.bucket:
            self._call(
                "copy",
                _shared_client().copy_object,
                Key=dest.key,
                CopySource={"Bucket": self.bucket, "Key": self.key},
            )
        else:
            dest.write_bytes(self.read_bytes())
        self.unlink(missing_ok=True)
        return dest

    rename = replace  # type: ignore[assignment]

    def remove_tree(self) -> None:
        """Delete every object below this directory."""
        self.delete_objects([o["Name"] for o in self.objects()])


def write_file(path: Path, data: bytes | str, *, sync: bool = False) -> None:
    """Write ``path`` whole: a reader sees the file before or after, never part of it (local: a
    temporary file beside it, with ``sync`` flushed to the disk, renamed over it; S3: one
    PUT)."""
    if isinstance(path, S3Path):
        path.write_bytes(data.encode() if isinstance(data, str) else data)
        return
    fill_file(
        path,
        lambda tmp: tmp.write_bytes(data.encode() if isinstance(data, str) else data),
        sync=sync,
    )


def fill_file(final: Path, fill: Callable[[Path], object], *, sync: bool = True) -> Path:
    """``fill`` a local temporary file (an Arrow writer's, say), then put it at ``final`` whole:
    beside it, synced (unless not ``sync``) and renamed over it, or uploaded to S3."""
    if isinstance(final, S3Path):
        with tempfile.TemporaryDirectory(prefix="srt-put-") as scratch:
            tmp = Path(scratch) / final.name
            fill(tmp)
            final.upload(tmp)
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.with_name(f".{final.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        fill(tmp)
        if sync:
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
        os.replace(tmp, final)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return final


@contextlib.contextmanager
def local_copy(path: Path) -> Iterator[Path]:
    """``path`` as a local file for as long as the block runs: itself, or a download of an
    object on S3 (removed afterwards)."""
    if not isinstance(path, S3Path):
        yield path
        return
    with tempfile.TemporaryDirectory(prefix="srt-get-") as scratch:
        local = Path(scratch) / path.name
        path.download(local)
        yield local


def upload_tree(local: Path, dest: Path) -> None:
    """Copy every file below the local directory ``local`` to ``dest`` (on S3 or local), in the
    same places."""
    for f in sorted(p for p in local.rglob("*") if p.is_file()):
        target = dest / f.relative_to(local).as_posix()
        if isinstance(target, S3Path):
            target.upload(f)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(f, target)


def read_arrow(path: Path) -> Any:
    """A pyarrow source over the Arrow file ``path``: mapped from a local disk, read whole
    from S3."""
    import pyarrow as pa

    if isinstance(path, S3Path):
        return pa.BufferReader(path.read_bytes())
    return pa.memory_map(str(path))


def remove_tree(path: Path) -> None:
    """``shutil.rmtree`` for a local directory or an S3 prefix."""
    if isinstance(path, S3Path):
        path.remove_tree()
    else:
        shutil.rmtree(path)


def open_store(location: str | Path) -> Store:
    """``s3://bucket/prefix`` or a local directory."""
    text = str(location)
    if text.startswith("s3://"):
        return S3Store(text)
    if "://" in text:
        raise ConfigError(f"unsupported location {text!r}: use a local path or s3://bucket/prefix")
    return LocalStore(text)
