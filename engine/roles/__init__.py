"""Worker objects the controller drives: actor-rollout-reference, critic; their models and optimizers."""
