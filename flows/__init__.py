"""Prefect flows: gpt2-pretrain, one flow per stage, gpt2-evaluate (docs/pipeline.md)."""
