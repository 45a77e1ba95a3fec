"""Prefect tasks, one per pipeline stage, with content-keyed caching and retries (docs/pipeline.md)."""
