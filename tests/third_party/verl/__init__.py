"""verl's own files (Apache-2.0), unchanged but for what each module's docstring names: its
rollout-correction helpers at 0.7 and at main and its optimal token baselines, the references
of ``tests/engine/algorithms``' parity tests; and in ``scripts/``, example scripts of verl 0.7
(``examples/gmpo_trainer/test_dapo_7b_math.sh``, ``recipe/dapo/run_dapo_qwen2.5_32b.sh``) and of
verl main at b178a3c (``examples/cispo_trainer/run_cispo_qwen2_5_0_5b_gsm8k.sh``,
``examples/grpo_trainer/run_qwen2-7b_math_trtllm.sh``,
``examples/ppo_trainer/run_deepseek7b_llm_pfppo.sh``) that the command-line tests read."""
