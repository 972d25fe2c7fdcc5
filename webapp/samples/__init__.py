"""Rollout sample inspector: step, group, across-steps and across-runs views, token colouring, exports."""
