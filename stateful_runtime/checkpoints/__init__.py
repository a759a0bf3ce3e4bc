"""Everything about checkpoints and savepoints.

* :mod:`~stateful_runtime.checkpoints.layout` — a job's checkpoint directory: where each part
  lives, its ownership marker (written only here), the one reader of Spark's offset and commit
  logs, the files one batch needs.
* :mod:`~stateful_runtime.checkpoints.verify` — the files a restart reads, checked; a full disk.
* :mod:`~stateful_runtime.checkpoints.recovery` — a damaged checkpoint at start: fall back or
  refuse.
* :mod:`~stateful_runtime.checkpoints.manifest` — the versioned savepoint manifest.
* :mod:`~stateful_runtime.checkpoints.savepoints` — create, list, resolve, dispose.
* :mod:`~stateful_runtime.checkpoints.retention` — which savepoints to keep.
* :mod:`~stateful_runtime.checkpoints.restore` — compatibility, restore, rescale.
* :mod:`~stateful_runtime.checkpoints.mirror` — the incremental checkpoint mirror (S3).
* :mod:`~stateful_runtime.checkpoints.storage` — local directory and S3 stores.
* :mod:`~stateful_runtime.checkpoints.state_reader` — ``srt state inspect``.
"""
