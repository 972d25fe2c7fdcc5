"""The names of the reward registry, in one place the config schema imports without the scorers.

``register_reward_fn`` refuses a name not listed in ``REWARD_FN_NAMES``, and the tests check that
every listed name is registered, so ``reward.components[*].name`` accepts exactly the registered
rewards. To add a reward, list its name here and register it in ``engine.rewards.registry``.
"""

# Names in engine.rewards.registry, in the order the config lists them.
REWARD_FN_NAMES = (
    "default",
    "tiny_arithmetic",
    "gsm8k",
    "math",
    "exact_match",
    "keyword",
    "format",
    "sql_safety",
    "code_exec",
)
# reward.components[*].name: the registry's names, the reward model and the custom function.
REWARD_COMPONENTS = (*REWARD_FN_NAMES, "reward_model", "custom")
# reward_model.reward_manager: verl's reward-manager names, each a class in
# engine.rewards.managers.REWARD_MANAGER_CLASSES.
REWARD_MANAGERS = ("naive", "dapo", "prime", "batch", "remote")
# reward_model.reward_kwargs: the keyword arguments each reward manager takes; batch takes any
# other key and passes it on to its batch function, as verl's BatchRewardManager does.
MANAGER_KWARGS = {
    "naive": (),
    "dapo": ("max_resp_len", "overlong_buffer_cfg"),
    "prime": ("timeout",),
    "remote": (
        "endpoint",
        "timeout",
        "max_retries",
        "backoff_s",
        "max_concurrent",
        "max_rpm",
        "batch_size",
        "on_error",
    ),
}
# The arguments the batch manager passes its function itself.
BATCH_ARGUMENTS = ("data_sources", "solution_strs", "ground_truths", "extra_infos")
# dapo's reward_kwargs.overlong_buffer_cfg keys.
BUFFER_KEYS = ("enable", "len", "penalty_factor", "log")

# data_source values the default reward (engine.rewards.default) scores, grouped by scorer, with
# what each expects in reward_model.ground_truth. Torch-free, so the studio's upload form and
# config checks can offer and check them; default.py dispatches on the same tuples.
GSM8K_SOURCES = ("openai/gsm8k", "gsm8k")
MATH_SOURCES = (
    "lighteval/MATH",
    "DigitalLearningGmbH/MATH-lighteval",
    "HuggingFaceH4/MATH-500",
    "math",
)
CODE_SOURCES = ("code", "codecontests", "apps", "codeforces", "taco")
# The tiny tool tasks (engine.tools.tiny_task, engine.tools.tiny_interpreter_task).
TOOL_ANSWER_SOURCES = ("tiny_calculator", "tiny_interpreter")
SCORER_GROUND_TRUTHS = (
    (GSM8K_SOURCES, "the final number, e.g. 72; the response must end with '#### <number>'"),
    (MATH_SOURCES, "the answer in LaTeX, e.g. \\frac{1}{2}; compared with the last \\boxed{}"),
    (("tiny_arithmetic",), "an integer; compared with the first integer of the response"),
    (TOOL_ANSWER_SOURCES, "an integer; the answer of the last tool call, or the response's"),
    (("exact_match",), "the whole expected response (or a list of accepted ones)"),
    (("sql_safety",), "optional: a reference SQL query; tables allowed from extra_info"),
    (CODE_SOURCES, 'the tests: {"inputs": [...], "outputs": [...]} or {"assert": "..."} (JSON)'),
)
# data_source -> what its scorer expects in ground_truth.
DATA_SOURCE_SCORERS = {
    source: expects for sources, expects in SCORER_GROUND_TRUTHS for source in sources
}
