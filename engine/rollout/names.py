"""The names the rollout settings accept, in one torch-free place the config schema imports.

``register_rollout`` refuses a backend not listed in ``ROLLOUT_NAMES``, so
``actor_rollout_ref.rollout.name`` accepts exactly the registered backends; the multi-turn
rollout checks its format, truncation side and sanity-check mode against the lists below.
"""

# actor_rollout_ref.rollout.name: engine.rollout's registry of backends.
ROLLOUT_NAMES = ("hf", "vllm", "sglang")
# What rollout.name=sglang says where SGLang is not installed (the config validator and the
# backend itself).
SGLANG_MISSING = (
    "SGLang is not installed: pip install -e .[sglang] on a CUDA machine, or use "
    "actor_rollout_ref.rollout.name=hf"
)

# multi_turn.format: the tool-call formats engine.rollout.tool_calls parses.
TOOL_CALL_FORMATS = ("hermes",)
# multi_turn.tool_response_truncate_side: which end of a long tool answer is cut.
TRUNCATE_SIDES = ("left", "middle", "right")
# multi_turn.tokenization_sanity_check_mode: verl's values (engine.rollout.multi_turn).
SANITY_CHECK_MODES = ("strict", "ignore_strippable", "disable")
