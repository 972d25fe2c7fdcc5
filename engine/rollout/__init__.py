"""Rollout engines: the lean HF sampling loop (CPU and GPU) and the vLLM adapter (GPU)."""
