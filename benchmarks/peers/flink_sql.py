"""Flink 2.3 SQL peer: one workload as a Flink SQL job on a local MiniCluster.

Runs in the harness's Flink venv (``benchmarks/.venvs/flink``, ``apache-flink==2.3.0``), never
with the project's packages. Parallelism 2, RocksDB state backend (incremental), a checkpoint
every 2 s into ``--checkpoints``; the input is read with the filesystem connector (JSON) and
the output written with it as JSON lines into ``--output``.

    python flink_sql.py --workload upi --input /abs/parts --output /abs/out \
        --checkpoints /abs/ck --result /abs/result.json

Writes ``--result``: wall times (``time.time()``) of interpreter start, submission and end, and
the job's net runtime (Flink's ``JobExecutionResult.getNetRuntime``: the job's own execution
time without the client's start-up).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

T_IMPORT = time.time()

SOURCES = {
    "upi": "txn_id STRING, merchant_id STRING, amount_paise BIGINT, ts_ms BIGINT",
    "bids": (
        "auction BIGINT, bidder BIGINT, price BIGINT, channel STRING, url STRING, ts_ms BIGINT"
    ),
    "jrefunds": "refund_id STRING, txn_id STRING, refund_paise BIGINT, ts_ms BIGINT",
    "jtiers": "merchant_id STRING, tier STRING, ts_ms BIGINT",
}
# A versioned table (FOR SYSTEM_TIME AS OF): a primary key and an event-time attribute.
PRIMARY_KEYS = {"jtiers": "merchant_id"}
SOURCES["jpay"] = SOURCES["upi"]

# two-input workload -> its second stream (table src2, from --input2)
SECOND = {"interval": "jrefunds", "temporal": "jtiers"}

# workload -> (stream, sink columns, query)
QUERIES = {
    "upi": (
        "upi",
        "merchant_id STRING, window_start TIMESTAMP(3), `count` BIGINT",
        """
        SELECT merchant_id, window_start, COUNT(*) AS `count`
        FROM TABLE(TUMBLE(TABLE src, DESCRIPTOR(rt), INTERVAL '1' MINUTE))
        GROUP BY merchant_id, window_start, window_end""",
    ),
    "q1": (
        "bids",
        "auction BIGINT, bidder BIGINT, price_eur BIGINT, ts_ms BIGINT",
        """
        SELECT auction, bidder,
               CAST((price * 908 - MOD(price * 908, 1000)) / 1000 AS BIGINT) AS price_eur, ts_ms
        FROM src""",
    ),
    "q2": (
        "bids",
        "auction BIGINT, price BIGINT",
        """
        SELECT auction, price FROM src WHERE MOD(auction, 123) = 0""",
    ),
    "q5": (
        "bids",
        "channel STRING, window_start TIMESTAMP(3), auction BIGINT, bids BIGINT",
        """
        SELECT channel, window_start, auction, bids FROM (
          SELECT *, ROW_NUMBER() OVER (PARTITION BY channel, window_start, window_end
                                       ORDER BY bids DESC, auction ASC) AS rn
          FROM (SELECT channel, auction, window_start, window_end, COUNT(*) AS bids
                FROM TABLE(HOP(TABLE src, DESCRIPTOR(rt), INTERVAL '2' SECOND,
                               INTERVAL '10' SECOND))
                GROUP BY channel, auction, window_start, window_end))
        WHERE rn = 1""",
    ),
    "q7": (
        "bids",
        "channel STRING, window_start TIMESTAMP(3), max_price BIGINT",
        """
        SELECT channel, window_start, MAX(price) AS max_price
        FROM TABLE(TUMBLE(TABLE src, DESCRIPTOR(rt), INTERVAL '10' SECOND))
        GROUP BY channel, window_start, window_end""",
    ),
    "q11": (
        "bids",
        ("bidder BIGINT, session_start TIMESTAMP(3), window_end TIMESTAMP(3), bids BIGINT"),
        """
        SELECT bidder, window_start AS session_start, window_end, COUNT(*) AS bids
        FROM TABLE(SESSION(TABLE src PARTITION BY bidder, DESCRIPTOR(rt), INTERVAL '10' SECOND))
        GROUP BY bidder, window_start, window_end""",
    ),
    # The ValueState counter in SQL: a running count per key in event-time order.
    "counter": (
        "upi",
        "merchant_id STRING, `count` BIGINT",
        """
        SELECT merchant_id, cnt AS `count` FROM (
          SELECT merchant_id, COUNT(*) OVER (PARTITION BY merchant_id ORDER BY rt
                 ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS cnt
          FROM src)
        WHERE MOD(cnt, 100) = 0""",
    ),
    # Flink SQL's deduplication (keep first row by processing time); its state TTL
    # (table.exec.state.ttl) is in processing time: SQL has no event-time TTL.
    "dedup": (
        "upi",
        "txn_id STRING, merchant_id STRING, amount_paise BIGINT, ts_ms BIGINT",
        """
        SELECT txn_id, merchant_id, amount_paise, ts_ms FROM (
          SELECT *, ROW_NUMBER() OVER (PARTITION BY txn_id ORDER BY pt ASC) AS rn FROM src)
        WHERE rn = 1""",
    ),
    # Interval join: each refund with its payment 0 to 30 minutes (inclusive) before it.
    "interval": (
        "jpay",
        (
            "refund_id STRING, txn_id STRING, merchant_id STRING, payment_paise BIGINT, "
            "refund_paise BIGINT, after_s BIGINT"
        ),
        """
        SELECT r.refund_id, p.txn_id, p.merchant_id, p.amount_paise AS payment_paise,
               r.refund_paise,
               CAST((r.ts_ms - p.ts_ms - MOD(r.ts_ms - p.ts_ms, 1000)) / 1000 AS BIGINT)
                 AS after_s
        FROM src p, src2 r
        WHERE p.txn_id = r.txn_id
          AND r.rt BETWEEN p.rt AND p.rt + INTERVAL '30' MINUTE""",
    ),
    # Event-time temporal join against the versioned tiers table.
    "temporal": (
        "jpay",
        (
            "txn_id STRING, merchant_id STRING, amount_paise BIGINT, tier STRING, "
            "tier_since_ms BIGINT, ts_ms BIGINT"
        ),
        """
        SELECT p.txn_id, p.merchant_id, p.amount_paise, COALESCE(t.tier, 'unrated') AS tier,
               t.ts_ms AS tier_since_ms, p.ts_ms
        FROM src p
        LEFT JOIN src2 FOR SYSTEM_TIME AS OF p.rt AS t ON p.merchant_id = t.merchant_id""",
    ),
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workload", required=True, choices=sorted(QUERIES))
    ap.add_argument("--input", required=True, help="absolute path: a file or a directory")
    ap.add_argument("--input2", help="a two-input workload's second input (table src2)")
    ap.add_argument("--output", required=True)
    ap.add_argument("--checkpoints", required=True)
    ap.add_argument("--result", required=True)
    ap.add_argument("--parallelism", type=int, default=2)
    ap.add_argument("--checkpoint-interval", default="2 s")
    a = ap.parse_args()

    from pyflink.common import Configuration
    from pyflink.table import EnvironmentSettings, TableEnvironment

    conf = Configuration()
    for k, v in {
        "parallelism.default": str(a.parallelism),
        "state.backend.type": "rocksdb",
        "execution.checkpointing.incremental": "true",
        "execution.checkpointing.interval": a.checkpoint_interval,
        "execution.checkpointing.dir": f"file://{a.checkpoints}",
        "table.local-time-zone": "UTC",
        "table.exec.state.ttl": "1 min",
        "python.executable": sys.executable,  # else "python" on PATH runs the UDF workers
        "python.client.executable": sys.executable,
        "restart-strategy.type": "none",  # a failing job fails the run instead of looping
        "rest.bind-address": "127.0.0.1",
        "rest.address": "127.0.0.1",
    }.items():
        conf.set_string(k, v)
    env = TableEnvironment.create(
        EnvironmentSettings.new_instance().in_streaming_mode().with_configuration(conf).build()
    )
    stream, sink_cols, query = QUERIES[a.workload]
    tables = [("src", stream, a.input)]
    if a.workload in SECOND:
        tables.append(("src2", SECOND[a.workload], a.input2))
    for table, source, path in tables:
        key = (
            f",\n PRIMARY KEY ({PRIMARY_KEYS[source]}) NOT ENFORCED"
            if source in PRIMARY_KEYS
            else ""
        )
        env.execute_sql(f"""
            CREATE TABLE {table} ({SOURCES[source]},
              rt AS TO_TIMESTAMP_LTZ(ts_ms, 3),
              pt AS PROCTIME(),
              WATERMARK FOR rt AS rt - INTERVAL '5' SECOND{key}
            ) WITH ('connector' = 'filesystem', 'path' = 'file://{path}', 'format' = 'json')""")
    env.execute_sql(f"""
        CREATE TABLE sink ({sink_cols})
        WITH ('connector' = 'filesystem', 'path' = 'file://{a.output}', 'format' = 'json')""")
    t_submit = time.time()
    result = env.execute_sql(f"INSERT INTO sink {query}")
    client = result.get_job_client()
    job_result = client.get_job_execution_result().result()
    t_done = time.time()
    with open(a.result, "w") as f:
        json.dump(
            {
                "t_import": T_IMPORT,
                "t_submit": t_submit,
                "t_done": t_done,
                "job_id": str(client.get_job_id()),
                "net_runtime_ms": job_result.get_net_runtime(),
            },
            f,
        )


if __name__ == "__main__":
    main()
