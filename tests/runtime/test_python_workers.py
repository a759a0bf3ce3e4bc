"""Spark's Python workers import the installed pyspark (bytecode cached), not the copy in
pyspark.zip that Spark puts first on their path (compiled from source in every new worker):
platform/bootstrap.sh's .pth hook."""

from __future__ import annotations


def test_workers_import_pyspark_with_cached_bytecode(spark):
    def where(_):  # runs in a Python worker
        import sys

        import py4j
        import pyspark
        return [pyspark.__file__, py4j.__file__, [p for p in sys.path if "pyspark" in p]]

    [(pyspark_file, py4j_file, spark_paths)] = (
        spark.sparkContext.parallelize([0], 1).map(where).collect())
    assert ".zip" not in pyspark_file and ".zip" not in py4j_file, (pyspark_file, py4j_file)
    assert not [p for p in spark_paths if p.endswith(".zip")], spark_paths
