"""Datasets: files a user uploads (JSONL, parquet, CSV) with a preview and a key mapping."""
