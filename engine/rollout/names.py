"""The names of the rollout settings, in one place the config schema imports without torch.

``actor_rollout_ref.rollout.name`` takes :data:`ROLLOUT_NAMES` (``engine.rollout``'s registry
refuses a backend not listed here), ``multi_turn.format`` takes :data:`TOOL_CALL_FORMATS` and
``multi_turn.tool_response_truncate_side`` :data:`TRUNCATE_SIDES` (``engine.rollout.tool_calls``),
``multi_turn.tokenization_sanity_check_mode`` :data:`SANITY_CHECK_MODES`
(``engine.rollout.multi_turn``).
"""

ROLLOUT_NAMES = ("hf", "vllm", "sglang")
# Here, not in sglang_rollout, so that config validation can say it without importing torch.
SGLANG_MISSING = (
    "SGLang is not installed: pip install -e .[sglang] on a CUDA machine, or use "
    "actor_rollout_ref.rollout.name=hf"
)
# verl's multi_turn.tokenization_sanity_check_mode values.
SANITY_CHECK_MODES = ("strict", "ignore_strippable", "disable")
TOOL_CALL_FORMATS = ("hermes",)
TRUNCATE_SIDES = ("left", "middle", "right")
