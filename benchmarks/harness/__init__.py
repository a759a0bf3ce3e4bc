"""Side-by-side benchmark harness (issue 14): this runtime against Flink 2.3 (SQL and Python
DataStream) and bytewax 0.21 on the same generated events. Entry point: ``benchmarks/run.py``.

Modules: ``data`` (seeded generators, inputs per system, reference answers), ``workloads``
(what each workload computes and how its output is checked), ``procmon`` (process-tree memory
and CPU), ``systems`` (how each system is run and timed), ``latency``, ``scaleout``,
``profiles``, ``report`` (JSON, plots, BENCHMARKS.md), ``progress``.
"""
