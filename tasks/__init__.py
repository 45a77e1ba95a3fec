"""Prefect tasks, one module per pipeline stage, with content-keyed caching and retries (docs/pipeline.md).

The work lives in data/ and gpt2/; a stage task only

1. calls that code (in process, or `torchrun -m gpt2.train` / `python -m gpt2.*` as a child process),
2. returns a small `StageRecord` (paths, content hashes, metrics) that the next stage takes as input,
3. publishes an artifact people look at.

Every task caches with `StageCache` (key = parameters + inputs by content + code version; a record whose
files changed is recomputed) and has a retry policy: network stages back off exponentially with jitter,
training retries resume from the latest checkpoint, deterministic errors are never retried.

    download.py  tokenize.py  hellaswag.py  init.py  train.py  evaluate.py  sample.py  export.py   one stage each
    common.py    helpers the stage modules share (logging, child processes, artifact keys)
    cache.py     records and the cache policy;  retry.py  retry rules;  launch.py  child processes
    cancel_watch.py   a flow run's own watch for its cancellation (survives a server outage)
    report.py    training figures and summaries
"""
