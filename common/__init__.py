"""Helpers every layer shares (gpt2/, data/, tasks/, flows/): atomic files, JSON I/O, hashing. No prefect."""
