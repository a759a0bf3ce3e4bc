"""A value a table's existing column cannot store is found before the write, by row, and named;
the rows of a table whose types are the job's are not looked at."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dbt_sink.limits import holds_no_nul, limit_of, reasons, storable, takes, unstorable
from stateful_runtime.exceptions import SinkError

WIDE = pa.decimal128(38, 0)
NUMBER_COLUMNS = {
    # type name (as DuckDB, PostgreSQL, ClickHouse report it) -> inclusive range
    "BIGINT": (-(2**63), 2**63 - 1),
    "bigint": (-(2**63), 2**63 - 1),
    "Nullable(Int64)": (-(2**63), 2**63 - 1),
    "INTEGER": (-(2**31), 2**31 - 1),
    "integer": (-(2**31), 2**31 - 1),
    "Int32": (-(2**31), 2**31 - 1),
    "SMALLINT": (-(2**15), 2**15 - 1),
    "Int8": (-128, 127),
    "UInt64": (0, 2**64 - 1),
    "Nullable(UInt32)": (0, 2**32 - 1),
    "HUGEINT": (-(2**127), 2**127 - 1),
    "DECIMAL(18,0)": (-(10**18) + 1, 10**18 - 1),
    "numeric(20,0)": (-(10**20) + 1, 10**20 - 1),
    "Nullable(Decimal(38, 0))": (-(10**38) + 1, 10**38 - 1),
    "Decimal64(0)": (-(10**18) + 1, 10**18 - 1),
}


@given(
    st.sampled_from(sorted(NUMBER_COLUMNS)),
    st.lists(st.integers(-(10**38) + 1, 10**38 - 1) | st.none(), max_size=30),
)
@settings(max_examples=300, deadline=None)
def test_a_number_outside_the_column_is_found_and_only_it(column, values):
    low, high = NUMBER_COLUMNS[column]
    limit = limit_of(column)
    assert limit is not None and takes(limit, WIDE)
    batch = pa.table({"k": list(range(len(values))), "v": pa.array(values, WIDE)})
    found = unstorable(batch, {"v": limit})
    assert [u.row for u in found] == [
        i for i, v in enumerate(values) if v is not None and not low <= v <= high
    ]
    assert all(u.column == "v" and column in u.reason for u in found)


@given(st.lists(st.integers(-(2**63), 2**63 - 1), max_size=30))
@settings(max_examples=100, deadline=None)
def test_an_int64_column_into_a_bigint_is_not_looked_at(values):
    batch = pa.table({"v": pa.array(values, pa.int64())})
    assert unstorable(batch, {"v": limit_of("BIGINT"), "w": limit_of("INTEGER")}) == []


@given(
    st.sampled_from(["FixedString(4)", "Nullable(FixedString(4))", "character varying(4)"]),
    st.lists(st.text(max_size=8) | st.none(), max_size=20),
)
@settings(max_examples=300, deadline=None)
def test_a_string_longer_than_its_column_is_found(column, values):
    """ClickHouse's FixedString counts bytes, PostgreSQL's varchar characters."""
    limit = limit_of(column)
    assert limit is not None and takes(limit, pa.string())
    size = (lambda s: len(s.encode())) if "Fixed" in column else len
    batch = pa.table({"s": pa.array(values, pa.string())})
    assert [u.row for u in unstorable(batch, {"s": limit})] == [
        i for i, s in enumerate(values) if s is not None and size(s) > 4
    ]


def test_columns_without_bounds_and_types_that_cannot_be_checked():
    for name in ("VARCHAR", "text", "String", "DOUBLE", "timestamp", "numeric", "Float64"):
        assert limit_of(name) is None, name
    assert not takes(limit_of("BIGINT"), pa.string())
    assert not takes(limit_of("BIGINT"), pa.decimal128(38, 2))  # a scale is not dropped
    assert not takes(limit_of("FixedString(4)"), pa.int64())
    assert takes(limit_of("DECIMAL(18,2)"), pa.decimal128(38, 2))


def test_the_error_names_each_row_its_value_and_the_way_on():
    batch = pa.table(
        {
            "merchant_id": ["M1", "M2", "M3"],
            "amount_paise": pa.array([Decimal(2 * (2**63 - 1)), Decimal(5), None], WIDE),
        }
    )
    with pytest.raises(SinkError) as err:
        storable(
            batch,
            {"amount_paise": limit_of("BIGINT")},
            ("merchant_id",),
            table="DuckDB table upi_counts in x.duckdb",
            batch_id=7,
            widen={"amount_paise": "DECIMAL(38,0)"},
        )
    text = str(err.value)
    assert "1 row(s) of batch 7" in text and "merchant_id='M1'" in text
    assert "18446744073709551614 is outside the range of BIGINT" in text
    assert "widen amount_paise to DECIMAL(38,0)" in text and "new sink.table" in text
    fine = storable(
        batch.slice(1),
        {"amount_paise": limit_of("BIGINT")},
        ("merchant_id",),
        table="t",
        batch_id=7,
        widen={},
    )
    # Checked, then written as the column's integers (ClickHouse's client takes no Decimal).
    assert fine.column("amount_paise").to_pylist() == [5, None]
    assert fine.schema.field("amount_paise").type == pa.int64()


# -- each warehouse, a table made narrower than the job's output ------------------------------

MAX = 2**63 - 1
SUMS = pa.schema([("merchant_id", pa.string()), ("amount_paise", WIDE)])


def _sums(rows: list[tuple[str, int]]) -> pa.Table:
    return pa.table(
        {"merchant_id": [m for m, _ in rows], "amount_paise": [Decimal(a) for _, a in rows]},
        schema=SUMS,
    )


def _written(sink, rows: pa.Table, batch_id: int) -> None:
    """One batch through the sink's write protocol, as the runtime drives it."""
    from stateful_runtime.connectors.base import PartitionedSink, prepare_rows

    if isinstance(sink, PartitionedSink):
        assert sink.begin_batch(batch_id, rows.schema)
        report = sink.write_partition(prepare_rows(rows, sink.key_columns), batch_id, 0, 1)
        sink.commit_batch(batch_id, [report])
    else:
        sink.write_batch(rows, batch_id)


def _trial(sink, read, create_narrow) -> None:
    """A table of BIGINT sums (an earlier version's, or a DBA's) takes the job's
    decimal(38,0) sums that fit, and a sum past int64 stops the batch by name, nothing of it
    written, until the column is widened."""
    create_narrow()
    _written(sink, _sums([("M1", MAX), ("M2", 5)]), 0)
    assert read() == {"M1": MAX, "M2": 5}
    with pytest.raises(SinkError) as err:
        _written(sink, _sums([("M1", 2 * MAX), ("M2", 7)]), 1)
    text = str(err.value)
    assert "merchant_id='M1'" in text and f"{2 * MAX} is outside the range of" in text
    assert "batch 1" in text and "widen amount_paise to" in text
    assert read() == {"M1": MAX, "M2": 5}


def test_duckdb_checks_each_row_against_a_narrower_column(tmp_path):
    import duckdb

    from dbt_sink.duckdb import DuckDBUpsertSink

    db = str(tmp_path / "x.duckdb")
    sink = DuckDBUpsertSink(db, "sums", ("merchant_id",))
    sink.open("job", "q")

    def create():
        with duckdb.connect(db) as con:
            con.execute("CREATE TABLE sums (merchant_id VARCHAR PRIMARY KEY, amount_paise BIGINT)")

    def read():
        with duckdb.connect(db, read_only=True) as con:
            return dict(con.execute("SELECT * FROM sums").fetchall())

    _trial(sink, read, create)


def test_postgres_checks_each_row_against_a_narrower_column(pg_dsn):
    import psycopg

    from dbt_sink.postgres import PostgresUpsertSink

    sink = PostgresUpsertSink(pg_dsn, "sums", ("merchant_id",))
    sink.open("job", "q")

    def create():
        with psycopg.connect(pg_dsn, autocommit=True) as con:
            con.execute("CREATE TABLE sums (merchant_id text PRIMARY KEY, amount_paise bigint)")

    def read():
        with psycopg.connect(pg_dsn) as con:
            return dict(con.execute("SELECT * FROM sums").fetchall())

    _trial(sink, read, create)


@pytest.mark.parametrize("backend", ["server-18.16", "chdb"])
def test_clickhouse_stores_a_wide_sum_exactly(backend, request, chdb_dir):
    """A table the sink creates holds a decimal(38,0) sum as Decimal(38, 0), digit for digit,
    through the native client (server 18.16) and chdb's Arrow insert."""
    from dbt_sink.clickhouse import ClickHouseUpsertSink

    url = (
        request.getfixturevalue("ch_url")
        if backend == "server-18.16"
        else f"chdb://{chdb_dir}?database=wide"
    )
    sink = ClickHouseUpsertSink(url, "wide_sums", ("merchant_id",))
    sink.open("job", "q")
    sums = [("M1", 2 * MAX), ("M2", -(10**37)), ("M3", 0)]
    _written(sink, _sums(sums), 0)
    c = sink._client()
    try:
        got = dict(c.query("SELECT merchant_id, amount_paise FROM wide_sums FINAL"))
        (kind,) = [t for n, t, *_ in c.query("DESCRIBE TABLE wide_sums") if n == "amount_paise"]
    finally:
        c.close()
    assert got == dict(sums) and "Decimal(38, 0)" in kind


def test_clickhouse_checks_each_row_against_a_narrower_column(ch_url):
    from dbt_sink.clickhouse import VERSION_COLUMN, ClickHouseUpsertSink

    sink = ClickHouseUpsertSink(ch_url, "sums", ("merchant_id",))
    sink.open("job", "q")

    def create():
        c = sink._client()
        try:
            c.command(
                f"CREATE TABLE sums (merchant_id FixedString(2), amount_paise Nullable(Int64), "
                f"{VERSION_COLUMN} UInt64) ENGINE = ReplacingMergeTree({VERSION_COLUMN}) "
                f"ORDER BY merchant_id"
            )
        finally:
            c.close()

    def read():
        c = sink._client()
        try:
            return {
                m.rstrip("\x00") if isinstance(m, str) else m.decode().rstrip("\x00"): a
                for m, a in c.query("SELECT merchant_id, amount_paise FROM sums FINAL")
            }
        finally:
            c.close()

    _trial(sink, read, create)
    # FixedString(2): a key of three bytes is named too (never cut to two).
    with pytest.raises(SinkError, match="a string of 3 bytes does not fit FixedString"):
        _written(sink, _sums([("M10", 1)]), 2)


def test_delta_checks_each_row_against_a_narrower_column(tmp_path):
    """A Delta table of int64 sums (an earlier version's) takes the decimal(38,0) sums that
    fit, as int64, and a sum past int64 stops the batch by name."""
    from deltalake import write_deltalake

    from dbt_sink.delta import DeltaUpsertSink

    path = str(tmp_path / "sums")
    sink = DeltaUpsertSink(path, "sums", ("merchant_id",))
    sink.open("job", "q")

    def create():
        schema = pa.schema([("merchant_id", pa.string()), ("amount_paise", pa.int64())])
        write_deltalake(path, schema.empty_table(), mode="append", name="sums")

    def read():
        t = sink.read_arrow()
        return dict(zip(*(t.column(c).to_pylist() for c in SUMS.names), strict=True))

    _trial(sink, read, create)


def test_a_time_before_1970_is_named_for_clickhouse_datetime():
    """ClickHouse's DateTime range, at its edges (the server would wrap the value)."""
    t = pa.timestamp("us")
    edge = [
        datetime(1969, 12, 31, 23, 59, 59),
        datetime(1970, 1, 1),
        datetime(2106, 2, 7, 6, 28, 15),
        datetime(2106, 2, 7, 6, 28, 16),
    ]
    limit = limit_of("Nullable(DateTime('UTC'))")
    assert limit is not None
    found = reasons(pa.table({"at": pa.array(edge, t)}), {"at": limit}, "ClickHouse table x")
    assert [i for i, _ in found] == [0, 3]
    assert "1969-12-31T23:59:59 is outside the range of" in found[0][1]
    aware = pa.array([e.replace(tzinfo=UTC) for e in edge], pa.timestamp("us", tz="UTC"))
    assert [i for i, _ in reasons(pa.table({"at": aware}), {"at": limit}, "x")] == [0, 3]


@given(
    st.lists(st.text(max_size=12) | st.none(), max_size=30), st.sampled_from(["text", "varchar(8)"])
)
@settings(max_examples=200, deadline=None)
def test_a_postgresql_string_with_a_nul_is_found_and_only_it(values, column):
    limit = holds_no_nul(limit_of(column), column)
    found = reasons(pa.table({"v": pa.array(values, pa.string())}), {"v": limit}, "t")
    width = limit.length
    assert [i for i, _ in found] == [
        i
        for i, v in enumerate(values)
        if v is not None and ("\x00" in v or (width is not None and len(v) > width))
    ]
