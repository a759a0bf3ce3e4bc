"""The driver's Spark home on a local master: PySpark's own, with its jars merged into one.

Spark's launcher puts every jar of ``$SPARK_HOME/jars`` (280 in PySpark 4.3) on the driver's
class path, and a lookup of a name that is no class or resource there (Hadoop's configuration
resources, Janino's and Scala reflection's probes: ~12% of a short run's JVM samples, NOTES.md)
opens and searches every one of them. One jar answers it with one lookup: a 3,000-event UPI
run 0.5-0.9 s sooner and ~0.6-1.2 CPU-s cheaper (NOTES.md, "One jar for the driver").

Built once per venv by ``platform/bootstrap.sh`` (``python -m stateful_runtime.runtime.spark_home``)
under ``.venv/share/stateful-runtime/spark-home``: ``bin`` and ``sbin`` are PySpark's (links),
``jars/spark.jar`` holds every entry of PySpark's jars, the first of a name in jar order where
they repeat, but for what a jar lists rather than defines: ``META-INF/services`` files and
Log4j's plugin caches (every jar's, merged), jar indexes and signatures (dropped: they speak
of the jars as they were). One provider is left out of the listings: MLlib's session extension
(``_LEFT_OUT``), which registers ``vector_to_array`` and ``array_to_vector`` as internal
functions for Spark Connect's clients through Scala's runtime reflection, in every session's
start: ~0.35 CPU-s and ~0.3 s of a short run's wall (a third of the session's creation), for
functions no job of this runtime calls (``pyspark.ml.functions`` calls MLlib's JVM functions
directly). No ``python`` directory: the zips of pyspark Spark would put on its
workers' path are not there, and the workers import the installed pyspark, as they do anyway
(platform/bootstrap.sh). A home built for another PySpark is not used (``stamp``), nor with
``SRT_MERGED_JARS=off``; a cluster's executors run their own Spark.
"""

from __future__ import annotations

import io
import os
import shutil
import struct
import sys
import tempfile
import zipfile
from collections.abc import Iterable
from pathlib import Path

ENV = "SRT_MERGED_JARS"  # "off": PySpark's own Spark home
JAR = "spark.jar"
STAMP = "stamp"
_SERVICES = "META-INF/services/"
_PLUGINS = "META-INF/org/apache/logging/log4j/core/config/plugins/Log4j2Plugins.dat"
_DROPPED = ("META-INF/MANIFEST.MF", "META-INF/INDEX.LIST")
_SIGNATURES = (".SF", ".DSA", ".RSA", ".EC")
# Providers the merged listings leave out, by services file (see the module doc).
_LEFT_OUT = {
    _SERVICES + "org.apache.spark.sql.SparkSessionExtensionsProvider": {
        b"org.apache.spark.sql.ml.InternalFunctionRegistration"
    },
}
# The merge's own version, in the stamp: a home built by an earlier merge is built again.
_MERGE = "merge 2: MLlib's session extension left out\n"
_MANIFEST = b"Manifest-Version: 1.0\r\nMulti-Release: true\r\nCreated-By: stateful-runtime\r\n\r\n"


def home() -> Path:
    return Path(sys.prefix) / "share" / "stateful-runtime" / "spark-home"


def pyspark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent


def _stamp(jars: Iterable[Path]) -> str:
    """What the merged jar was built from, and how: the merge's version, then each jar's name
    and size, in order."""
    return _MERGE + "".join(f"{j.name} {j.stat().st_size}\n" for j in jars)


def _jars(spark_home: Path) -> list[Path]:
    return sorted((spark_home / "jars").glob("*.jar"))


def built() -> bool:
    """Whether the merged Spark home is built for the installed PySpark."""
    try:
        stamp = (home() / STAMP).read_text()
    except OSError:
        return False
    return stamp == _stamp(_jars(pyspark_home()))


def merged_home() -> Path | None:
    """The merged Spark home, if it is built for the installed PySpark and not turned off."""
    return home() if os.environ.get(ENV) != "off" and built() else None


def build(target: Path | None = None) -> Path:
    """Build the merged home for the installed PySpark (in a directory beside ``target``,
    moved into place when complete)."""
    target = target or home()
    source = pyspark_home()
    jars = _jars(source)
    target.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".spark-home-", dir=target.parent))
    try:
        work.chmod(0o755)
        for name in ("bin", "sbin"):
            if (source / name).exists():
                (work / name).symlink_to(source / name)
        (work / "jars").mkdir()
        merge(jars, work / "jars" / JAR)
        (work / STAMP).write_text(_stamp(jars))
        shutil.rmtree(target, ignore_errors=True)
        os.replace(work, target)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return target


def merge(jars: Iterable[Path], out: Path) -> None:
    """Every entry of ``jars`` in one jar (see the module doc)."""
    seen: set[str] = set()
    listed: dict[str, list[bytes]] = {}
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as merged:
        merged.writestr("META-INF/MANIFEST.MF", _MANIFEST)
        for jar in jars:
            with zipfile.ZipFile(jar) as z:
                for info in z.infolist():
                    name = info.filename
                    if name.startswith(_SERVICES) and not name.endswith("/") or name == _PLUGINS:
                        listed.setdefault(name, []).append(z.read(info))
                        continue
                    upper = name.upper()
                    if (
                        name in seen
                        or name in _DROPPED
                        or (upper.startswith("META-INF/") and upper.endswith(_SIGNATURES))
                    ):
                        continue
                    seen.add(name)
                    merged.writestr(name, b"" if info.is_dir() else z.read(info))
        for name, parts in listed.items():
            if name == _PLUGINS:
                merged.writestr(name, merge_plugin_caches(parts))
            else:
                kept = [line for p in parts for line in p.rstrip(b"\n").split(b"\n")]
                left_out = _LEFT_OUT.get(name, set())
                kept = [line for line in kept if line.split(b"#")[0].strip() not in left_out]
                if any(line.split(b"#")[0].strip() for line in kept):
                    merged.writestr(name, b"".join(line + b"\n" for line in kept))


def merge_plugin_caches(caches: list[bytes]) -> bytes:
    """Log4j's plugin caches (``PluginCache``'s format: categories, each with its entries,
    written by ``DataOutputStream``) as one, an entry's first definition kept, as Log4j reads
    several."""
    categories: dict[str, dict[str, tuple[str, str, str, bool, bool]]] = {}
    for raw in caches:
        data = io.BytesIO(raw)
        for _ in range(_int(data)):
            entries = categories.setdefault(_utf(data), {})
            for _ in range(_int(data)):
                key, class_name, name = _utf(data), _utf(data), _utf(data)
                printable, defer = data.read(1) != b"\0", data.read(1) != b"\0"
                entries.setdefault(key, (key, class_name, name, printable, defer))
    out = io.BytesIO()
    out.write(struct.pack(">i", len(categories)))
    for category, entries in categories.items():
        _write_utf(out, category)
        out.write(struct.pack(">i", len(entries)))
        for key, class_name, name, printable, defer in entries.values():
            for text in (key, class_name, name):
                _write_utf(out, text)
            out.write(bytes([printable, defer]))
    return out.getvalue()


def _int(data: io.BytesIO) -> int:
    value: int = struct.unpack(">i", data.read(4))[0]
    return value


def _utf(data: io.BytesIO) -> str:
    (size,) = struct.unpack(">H", data.read(2))
    return data.read(size).decode("utf-8")  # (Java's modified UTF-8: the same for names)


def _write_utf(out: io.BytesIO, text: str) -> None:
    raw = text.encode("utf-8")
    out.write(struct.pack(">H", len(raw)) + raw)


if __name__ == "__main__":  # platform/bootstrap.sh: build (when not built), or print its path
    if sys.argv[1:] == ["--path"]:
        print(home())
    elif not built():
        print(f"spark home: {build()}")
