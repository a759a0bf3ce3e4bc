"""Where savepoints and checkpoint mirrors live: a local directory or S3 (through boto3).

One small interface, :class:`Store`, over keys relative to a root: put a file, put bytes (with
create-only semantics for commit points), read, list, delete. ``open_store("s3://bucket/prefix")``
gives an :class:`S3Store`, anything else a :class:`LocalStore`.

S3 settings come from boto3's own configuration (``AWS_ACCESS_KEY_ID``, ``AWS_REGION``,
``AWS_ENDPOINT_URL`` for an S3-compatible endpoint such as MinIO, SeaweedFS or moto, profiles);
``SRT_S3_ENDPOINT_URL`` overrides the endpoint for the runtime only. Large files go up in
multipart uploads (boto3's transfer manager, 8 MiB parts).
"""

from __future__ import annotations

import os
import shutil
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
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


def s3_client() -> Any:
    import boto3

    endpoint = os.environ.get("SRT_S3_ENDPOINT_URL") or None
    return boto3.client("s3", endpoint_url=endpoint)


class S3Store(Store):
    def __init__(self, url: str, client: Any = None) -> None:
        rest = url.removeprefix("s3://")
        self.bucket, _, prefix = rest.partition("/")
        if not self.bucket:
            raise ConfigError(f"{url!r} names no bucket; write s3://bucket/prefix")
        self.prefix = prefix.strip("/")
        self.url = f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"
        self.client = client or s3_client()

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def _call(self, what: str, fn: Any, **kwargs: Any) -> Any:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return fn(**kwargs)
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            if code in ("PreconditionFailed", "ConditionalRequestConflict"):
                raise AlreadyExistsError(f"{self.url}: {what} already exists") from None
            hint = f"; create the bucket {self.bucket!r} first" if code == "NoSuchBucket" else ""
            raise StorageError(f"{self.url}: {what} failed: {code or exc}{hint}") from None
        except BotoCoreError as exc:
            raise StorageError(
                f"{self.url}: {what} failed: {exc}. Check AWS credentials and the endpoint "
                f"(AWS_ENDPOINT_URL or SRT_S3_ENDPOINT_URL)"
            ) from None

    def put_file(self, local: Path, key: str) -> None:
        from boto3.s3.transfer import TransferConfig

        config = TransferConfig(
            multipart_threshold=MULTIPART_THRESHOLD, multipart_chunksize=MULTIPART_THRESHOLD
        )
        self._call(
            f"upload of {key}",
            self.client.upload_file,
            Filename=str(local),
            Bucket=self.bucket,
            Key=self._key(key),
            Config=config,
        )

    def put_bytes(self, key: str, data: bytes, *, create_only: bool = False) -> None:
        extra = {"IfNoneMatch": "*"} if create_only else {}
        self._call(
            f"write of {key}",
            self.client.put_object,
            Bucket=self.bucket,
            Key=self._key(key),
            Body=data,
            **extra,
        )

    def get_bytes(self, key: str) -> bytes:
        obj = self._call(
            f"read of {key}", self.client.get_object, Bucket=self.bucket, Key=self._key(key)
        )
        return obj["Body"].read()

    def get_file(self, key: str, local: Path) -> None:
        local.parent.mkdir(parents=True, exist_ok=True)
        self._call(
            f"download of {key}",
            self.client.download_file,
            Bucket=self.bucket,
            Key=self._key(key),
            Filename=str(local),
        )

    def list(self, prefix: str = "") -> Iterator[StoredObject]:
        paginator = self.client.get_paginator("list_objects_v2")
        full = self._key(prefix) if prefix else (f"{self.prefix}/" if self.prefix else "")
        pages = self._call(
            "listing", lambda: list(paginator.paginate(Bucket=self.bucket, Prefix=full))
        )
        cut = len(self.prefix) + 1 if self.prefix else 0
        for page in pages:
            for obj in page.get("Contents", []):
                yield StoredObject(obj["Key"][cut:], obj["Size"], obj["LastModified"].timestamp())

    def delete(self, keys: Sequence[str]) -> None:
        for i in range(0, len(keys), 1000):
            chunk = [{"Key": self._key(k)} for k in keys[i : i + 1000]]
            self._call(
                "delete",
                self.client.delete_objects,
                Bucket=self.bucket,
                Delete={"Objects": chunk, "Quiet": True},
            )


def open_store(location: str | Path) -> Store:
    """``s3://bucket/prefix`` or a local directory."""
    text = str(location)
    if text.startswith("s3://"):
        return S3Store(text)
    if "://" in text:
        raise ConfigError(f"unsupported location {text!r}: use a local path or s3://bucket/prefix")
    return LocalStore(text)
