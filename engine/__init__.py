"""PostTrain Studio's RL post-training engine: verl-compatible config, data, rewards, algorithms,
rollout, workers and trainer. It imports nothing from Django, Celery or Channels."""
