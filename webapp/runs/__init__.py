"""Runs: one launch of an experiment, its lifecycle, and the metrics and samples it records."""
