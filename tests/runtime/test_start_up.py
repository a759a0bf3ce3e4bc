"""Start-up costs the venv removes (platform/bootstrap.sh): Spark's Python workers import the
installed pyspark with cached bytecode, not the copy in pyspark.zip that Spark puts first on
their path (compiled from source in every new worker); the driver JVM maps a class archive
of the classes a job loads instead of loading and verifying them from the jars, and searches
one jar, not PySpark's 280; a local master's file system sets a checkpoint file's mode
without a `chmod` process."""

from __future__ import annotations

import io
import os
import struct
import zipfile
from pathlib import Path

import pytest

from stateful_runtime.runtime import session, spark_home


def test_workers_import_pyspark_with_cached_bytecode(spark):
    def where(_):  # runs in a Python worker
        import sys

        import py4j
        import pyspark

        return [pyspark.__file__, py4j.__file__, [p for p in sys.path if "pyspark" in p]]

    [(pyspark_file, py4j_file, spark_paths)] = (
        spark.sparkContext.parallelize([0], 1).map(where).collect()
    )
    assert ".zip" not in pyspark_file and ".zip" not in py4j_file, (pyspark_file, py4j_file)
    assert not [p for p in spark_paths if p.endswith(".zip")], spark_paths


def test_a_local_masters_checkpoint_files_get_their_mode_from_chmod_not_a_process(spark, tmp_path):
    """Hadoop's local file system forks `chmod` for every file it creates and its .crc; a
    local master's driver uses the venv's NioLocalFileSystem (platform/jvm-classes.sh, run by
    bootstrap), which sets the same mode through Java."""
    assert session.jvm_classes().is_file(), "platform/bootstrap.sh did not build srt-jvm.jar"
    jvm = spark.sparkContext._jvm
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    fs = jvm.org.apache.hadoop.fs.FileSystem.get(jvm.java.net.URI("file:///"), conf)
    assert fs.getClass().getName() == session.LOCAL_FS_CLASS
    out = fs.create(jvm.org.apache.hadoop.fs.Path(str(tmp_path / "offsets" / "0")), True)
    out.write(1)
    out.close()
    made = jvm.org.apache.hadoop.fs.permission.FsPermission
    want = made.getFileDefault().applyUMask(made.getUMask(conf)).toShort()
    assert (tmp_path / "offsets" / "0").stat().st_mode & 0o7777 == want
    assert (tmp_path / "offsets" / ".0.crc").stat().st_mode & 0o7777 == want
    assert (tmp_path / "offsets").stat().st_mode & 0o7777 == (
        made.getDirDefault().applyUMask(made.getUMask(conf)).toShort()
    )
    # On the class path's end, beside a user's spark.driver.extraClassPath, not instead of it.
    assert "spark.driver.extraClassPath" not in session.spark_conf(2, "local[2]")
    # A cluster's executors run elsewhere, without the venv: Hadoop's own file system there.
    assert "spark.hadoop.fs.file.impl" not in session.spark_conf(2, "spark://127.0.0.1:7077")


def test_the_driver_jvm_runs_from_the_venvs_class_archive(spark):
    jvm = spark.sparkContext._jvm
    args = list(jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments())
    assert f"-XX:SharedArchiveFile={session.class_archive()}" in args, args
    # Passed is not used: a JVM that finds the archive stale ignores it. Mapped is used.
    pid = jvm.java.lang.ProcessHandle.current().pid()
    maps = Path(f"/proc/{pid}/maps").read_text()
    assert str(session.class_archive()) in maps, "the JVM did not map the class archive"


def test_the_driver_jvm_runs_from_pysparks_jars_merged_into_one(spark):
    """A local master's JVM searches one jar for a class or resource, not PySpark's 280, and
    what the jars list rather than define is all there: every jar's services (Spark's data
    sources, Hadoop's file systems) and Log4j's plugins (the job's logging configuration
    loads; without them Log4j falls back to its default), but for MLlib's session extension,
    which the session does not load."""
    home = spark_home.merged_home()
    assert home is not None, "platform/bootstrap.sh did not merge PySpark's jars"
    jvm = spark.sparkContext._jvm
    path = jvm.java.lang.System.getProperty("java.class.path").split(":")
    jars = [p for p in path if p.endswith(".jar") and "srt-jvm" not in p]
    assert jars == [str(home / "jars" / spark_home.JAR)], path
    logging = jvm.org.apache.logging.log4j.LogManager.getContext(False).getConfiguration()
    assert logging.getClass().getSimpleName() == "PropertiesConfiguration"
    # every jar's services, for every service the jars list
    listed: dict[str, set[bytes]] = {}
    for jar in sorted((spark_home.pyspark_home() / "jars").glob("*.jar")):
        with zipfile.ZipFile(jar) as z:
            for name in z.namelist():
                if name.startswith("META-INF/services/") and not name.endswith("/"):
                    listed.setdefault(name, set()).update(_services(z.read(name)))
    extensions = "META-INF/services/org.apache.spark.sql.SparkSessionExtensionsProvider"
    mllib = b"org.apache.spark.sql.ml.InternalFunctionRegistration"
    assert mllib in listed[extensions]  # PySpark's jars list it: the merge leaves it out
    listed = {n: p - {mllib} for n, p in listed.items() if p - {mllib}}
    with zipfile.ZipFile(home / "jars" / spark_home.JAR) as merged:
        assert {name: _services(merged.read(name)) for name in listed} == listed
        assert extensions in listed or extensions not in merged.namelist()
    providers = jvm.java.util.ServiceLoader.load(
        jvm.java.lang.Class.forName("org.apache.spark.sql.SparkSessionExtensionsProvider")
    ).iterator()
    loaded = []
    while providers.hasNext():
        loaded.append(providers.next().getClass().getName())
    assert mllib.decode() not in loaded, loaded
    loader = jvm.java.util.ServiceLoader.load(
        jvm.java.lang.Class.forName("org.apache.spark.sql.sources.DataSourceRegister")
    )
    found, it = set(), loader.iterator()
    while it.hasNext():
        found.add(it.next().shortName())
    assert {"noop", "parquet", "json"} <= found


def _services(raw: bytes) -> set[bytes]:
    """The providers a services file lists (its comments and blank lines aside)."""
    lines = (line.split(b"#")[0].strip() for line in raw.splitlines())
    return {line for line in lines if line}


def test_merged_jars_keep_each_name_once_and_every_listing(tmp_path):
    def jar(name: str, entries: dict[str, bytes]) -> Path:
        path = tmp_path / name
        with zipfile.ZipFile(path, "w") as z:
            for entry, data in entries.items():
                z.writestr(entry, data)
        return path

    def plugins(*entries: tuple[str, str]) -> bytes:
        return spark_home.merge_plugin_caches([_cache({"core": list(entries)})])

    service = "META-INF/services/org.example.Service"
    first = jar(
        "a.jar",
        {
            "org/x/A.class": b"first",
            service: b"org.a.One\n",
            "META-INF/INDEX.LIST": b"JarIndex-Version: 1.0",
            "META-INF/KEY.SF": b"signed",
            spark_home._PLUGINS: plugins(("console", "org.a.Console")),
        },
    )
    second = jar(
        "b.jar",
        {
            "org/x/A.class": b"second",
            "org/x/B.class": b"b",
            service: b"org.b.Two",
            spark_home._PLUGINS: plugins(("console", "org.b.Other"), ("file", "org.b.File")),
        },
    )
    # MLlib's session extension is left out of its listing, whichever jar lists it, and a
    # listing left with no provider is not written.
    extensions = "META-INF/services/org.apache.spark.sql.SparkSessionExtensionsProvider"
    mllib = b"org.apache.spark.sql.ml.InternalFunctionRegistration"
    third = jar(
        "c.jar",
        {
            extensions: b"# licence\n" + mllib + b"\n",
            "META-INF/services/org.example.Other": b"org.c.Kept\n" + mllib + b"  \n",
        },
    )
    out = tmp_path / "merged.jar"
    spark_home.merge([first, second, third], out)
    with zipfile.ZipFile(out) as z:
        names = z.namelist()
        assert z.read("org/x/A.class") == b"first" and z.read("org/x/B.class") == b"b"
        assert z.read(service).split() == [b"org.a.One", b"org.b.Two"]
        assert "META-INF/INDEX.LIST" not in names and "META-INF/KEY.SF" not in names
        assert b"Multi-Release: true" in z.read("META-INF/MANIFEST.MF")
        assert extensions not in names
        assert z.read("META-INF/services/org.example.Other").split() == [b"org.c.Kept", mllib]
        merged = z.read(spark_home._PLUGINS)
    assert merged == _cache({"core": [("console", "org.a.Console"), ("file", "org.b.File")]})
    assert len(names) == len(set(names))


def _cache(categories: dict[str, list[tuple[str, str]]]) -> bytes:
    """A Log4j plugin cache as Log4j writes one (``PluginCache.writeCache``)."""
    out = io.BytesIO()
    out.write(struct.pack(">i", len(categories)))
    for category, entries in categories.items():
        out.write(struct.pack(">H", len(category)) + category.encode())
        out.write(struct.pack(">i", len(entries)))
        for key, cls in entries:
            for text in (key, cls, key.title()):
                out.write(struct.pack(">H", len(text)) + text.encode())
            out.write(b"\x01\x00")
    return out.getvalue()


def test_the_driver_jvm_never_looks_up_static_python_data_sources(spark):
    """Spark's driver runs ``PYSPARK_DRIVER_PYTHON`` only to look up pip-installed Python data
    sources when a data source first registers: a Python process (and a daemon that stays) on
    every job's start, for sources no job reads. The JVM's environment names no command, and
    after a registration no process of the JVM runs the lookup."""
    import os
    import shutil

    import psutil
    from pyspark.sql.datasource import DataSource

    jvm = spark.sparkContext._jvm
    named = jvm.java.lang.System.getenv("PYSPARK_DRIVER_PYTHON")
    assert named == session.NO_STATIC_DATA_SOURCES and shutil.which(named) is None
    assert os.environ.get("PYSPARK_DRIVER_PYTHON") != named  # this process's own is kept

    class Probe(DataSource):
        @classmethod
        def name(cls) -> str:
            return "srt_probe_lookup"

    spark.dataSource.register(Probe)

    def command(p: psutil.Process) -> str:
        try:
            return " ".join(p.cmdline())
        except psutil.Error:  # ended (or a zombie) since listed
            return ""

    pid = jvm.java.lang.ProcessHandle.current().pid()
    started = [command(p) for p in psutil.Process(pid).children(recursive=True)]
    assert not [c for c in started if "lookup_data_sources" in c], started


def test_a_local_masters_jvm_leaves_c2_to_the_hottest_code(monkeypatch):
    """One JVM runs every task of a local job beside its Python workers: HotSpot's optimising
    compiler at its default thresholds takes cores from the batches for minutes (session.py
    says what it cost). The default mode's options, as a JVM reads them."""
    monkeypatch.delenv(session.JIT_ENV, raising=False)
    opts = session.spark_conf(2, "local[2]")["spark.driver.extraJavaOptions"]
    flags = _final_flags(opts)
    assert flags["Tier4InvocationThreshold"] == "100000"
    assert flags["TieredStopAtLevel"] == "4"  # C2 still compiles


def test_the_options_of_the_mode_reach_the_driver_jvm(spark):
    """The JIT and collector the session chose (a short run's in the suite, tests/conftest.py,
    unless the environment chooses) are its driver JVM's: Spark's launch passed them on."""
    chosen = _final_flags(spark.sparkContext.getConf().get("spark.driver.extraJavaOptions"))
    jvm = spark.sparkContext._jvm
    bean = jvm.java.lang.management.ManagementFactory.getPlatformMXBean(
        jvm.java.lang.Class.forName("com.sun.management.HotSpotDiagnosticMXBean")
    )
    for flag in ("TieredStopAtLevel", "Tier4InvocationThreshold", "UseSerialGC", "UseG1GC"):
        assert bean.getVMOption(flag).getValue() == chosen[flag], flag


def _final_flags(options: str) -> dict[str, str]:
    """HotSpot's final value of every flag under ``options`` (``-XX:+PrintFlagsFinal``)."""
    import shlex
    import subprocess

    out = subprocess.run(
        ["java", *shlex.split(options), "-XX:+PrintFlagsFinal", "-version"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    flags = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) >= 4 and parts[2] == "=":
            flags[parts[1]] = parts[3]
    return flags


@pytest.mark.parametrize(
    "choice, master, short, driver, executor",
    [
        ("", "local[2]", False, "hot", "full"),
        ("", "local[2]", True, "quick", "full"),  # a short bounded run: C2 never pays back
        ("", "spark://127.0.0.1:7077", False, "full", "full"),
        ("", "spark://127.0.0.1:7077", True, "full", "full"),
        ("full", "local[2]", False, "full", "full"),
        ("hot", "local[2]", True, "hot", "full"),  # a choice stands, whatever the run's size
        ("quick", "spark://127.0.0.1:7077", False, "quick", "quick"),
        (" Quick ", "local[*]", False, "quick", "full"),
    ],
)
def test_the_jit_choice(monkeypatch, choice, master, short, driver, executor):
    monkeypatch.setenv(session.JIT_ENV, choice)
    for var in session._JVM_OPTION_VARS:
        monkeypatch.delenv(var, raising=False)
    conf = session.spark_conf(2, master, short_run=short)
    for role, mode in (("driver", driver), ("executor", executor)):
        opts = conf[f"spark.{role}.extraJavaOptions"]
        present = {name for name, flags in session.JIT_MODES.items() if flags and flags in opts}
        assert present == ({mode} if session.JIT_MODES[mode] else set()), (role, opts)
        # C1 only on a local master: the serial collector too; never on a cluster's executors
        serial = mode == "quick" and master.startswith("local") and role == "driver"
        assert (session.SERIAL_GC in opts) == serial, (role, opts)


def test_a_collector_chosen_by_the_environment_is_not_chosen_again(monkeypatch):
    """Two collector choices stop the JVM: a short run leaves the environment's alone."""
    monkeypatch.setenv(session.JIT_ENV, "")
    for var in session._JVM_OPTION_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("JAVA_TOOL_OPTIONS", "-Xss2m -XX:+UseParallelGC")
    opts = session.spark_conf(2, "local[2]", short_run=True)["spark.driver.extraJavaOptions"]
    assert session.JIT_MODES["quick"] in opts and session.SERIAL_GC not in opts


def test_a_run_is_short_when_bounded_and_its_sources_hold_few_records():
    few, many = session.SHORT_RUN_RECORDS // 2, session.SHORT_RUN_RECORDS
    assert session.short_run(True, [few])
    assert session.short_run(True, [few, few])  # at the bound
    assert not session.short_run(True, [few, few + 1])  # over it, in all
    assert not session.short_run(False, [few])  # an unbounded run lives on
    assert not session.short_run(True, [few, None])  # a source that cannot say
    assert not session.short_run(True, [many + 1])


def test_a_misspelt_jit_choice_says_what_to_use(monkeypatch):
    from stateful_runtime.exceptions import ConfigError

    monkeypatch.setenv(session.JIT_ENV, "c1")
    with pytest.raises(ConfigError, match="SRT_JVM_JIT='c1': use 'hot'.*'quick'.*'full'"):
        session.spark_conf(2, "local[2]")


@pytest.fixture
def archive(tmp_path, monkeypatch):
    monkeypatch.setenv(session.CLASS_ARCHIVE_ENV, str(tmp_path / "a" / "classes.jsa"))
    monkeypatch.delenv(session.CLASS_ARCHIVE_DUMP_ENV, raising=False)
    return session.class_archive()


def test_only_a_sealed_archive_of_the_sealed_size_is_used(archive, tmp_path):
    assert "SharedArchiveFile" not in session._class_archive_options()  # none built
    dumped = tmp_path / "dumped.jsa"
    dumped.write_bytes(b"x" * 4096)
    assert session.seal_class_archive(dumped) == archive and not dumped.exists()
    assert f"-XX:SharedArchiveFile={archive}" in session._class_archive_options()
    # A truncated archive crashes the JVM (SIGBUS): one whose size is not the sealed one is
    # left alone.
    archive.write_bytes(b"x" * 100)
    assert "SharedArchiveFile" not in session._class_archive_options()


def test_an_empty_dump_is_never_sealed(archive, tmp_path):
    (tmp_path / "empty.jsa").touch()
    with pytest.raises(ValueError, match="empty"):
        session.seal_class_archive(tmp_path / "empty.jsa")
    assert not archive.exists()


def test_off_switch_and_dump_mode(archive, tmp_path, monkeypatch):
    monkeypatch.setenv(session.CLASS_ARCHIVE_DUMP_ENV, str(tmp_path / "out.jsa"))
    assert session._class_archive_options() == f" -XX:ArchiveClassesAtExit={tmp_path / 'out.jsa'}"
    monkeypatch.delenv(session.CLASS_ARCHIVE_DUMP_ENV)
    monkeypatch.setenv(session.CLASS_ARCHIVE_ENV, "off")
    assert session._class_archive_options() == ""


def test_a_process_that_started_spark_ends_its_jvm_before_it_exits(tmp_path):
    """A process's exit stops Spark and waits for its JVM: when ``srt run`` returns, nothing of
    its tree is left running (left alone, the JVM began its shutdown only once the process had
    gone, and ended seconds later as an orphan)."""
    import os
    import subprocess
    import sys

    script = (
        "from stateful_runtime.runtime.session import build_session\n"
        "s = build_session(1, 'local[1]')\n"
        "print(s.sparkContext._gateway.proc.pid, flush=True)\n"
    )
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable}
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=True,
    )
    jvm = int(done.stdout.split()[-1])
    assert not Path(f"/proc/{jvm}").exists(), "the JVM outlived the process that started it"


def test_a_job_process_runs_openblas_without_its_thread_pool_unless_told(monkeypatch):
    from stateful_runtime._process import one_blas_thread

    monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)
    one_blas_thread()
    assert os.environ["OPENBLAS_NUM_THREADS"] == "1"
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "4")  # the environment's choice is kept
    one_blas_thread()
    assert os.environ["OPENBLAS_NUM_THREADS"] == "4"
