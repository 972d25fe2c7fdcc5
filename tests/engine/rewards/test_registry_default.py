import json

import pytest

from engine.rewards import (
    KNOWN_DATA_SOURCES,
    default_compute_score,
    get_reward_fn,
    list_reward_fns,
    register_reward_fn,
)


@pytest.mark.parametrize(
    ("data_source", "solution", "ground_truth", "expected"),
    [
        ("openai/gsm8k", "#### 1,234", "1234", 1.0),
        ("gsm8k", "#### 12", "1234", 0.0),
        ("lighteval/MATH", r"\boxed{\frac12}", r"\frac{1}{2}", 1.0),
        ("DigitalLearningGmbH/MATH-lighteval", r"\boxed{0.5}", r"\frac{1}{2}", 1.0),
        ("HuggingFaceH4/MATH-500", r"\boxed{3}", "4", 0.0),
        ("math", r"\boxed{3}", "3", 1.0),
        ("tiny_arithmetic", "12", "12", 1.0),
        ("exact_match", " yes ", "yes", 1.0),
    ],
)
def test_dispatch_returns_floats(data_source, solution, ground_truth, expected):
    score = default_compute_score(data_source, solution, ground_truth)
    assert type(score) is float and score == expected


def test_dispatch_returns_dicts_for_sql_and_code():
    sql = default_compute_score("sql_safety", "SELECT 1", "SELECT 1")
    assert sql["score"] == pytest.approx(1.0) and sql["safe"] == 1
    tests = json.dumps({"inputs": ["3"], "outputs": ["9"]})
    for source in ("code", "codecontests"):
        code = default_compute_score(source, "print(int(input()) ** 2)", tests)
        assert code["score"] == 1.0 and code["passed"] == 1


def test_dispatch_forwards_kwargs():
    assert default_compute_score("gsm8k", "it is 7", "7", method="flexible") == 1.0


def test_unknown_data_source_names_it_the_known_ones_and_the_fix():
    with pytest.raises(NotImplementedError) as info:
        default_compute_score("my/dataset", "x", "y")
    message = str(info.value)
    assert "'my/dataset'" in message and "custom_reward_function.path" in message
    for source in KNOWN_DATA_SOURCES:
        assert source in message


def test_registry_lists_the_builtin_rewards():
    assert list_reward_fns()[:9] == [
        "default",
        "tiny_arithmetic",
        "gsm8k",
        "math",
        "exact_match",
        "format",
        "keyword",
        "sql_safety",
        "code_exec",
    ]


@pytest.mark.parametrize(
    ("name", "solution", "ground_truth", "kwargs", "expected"),
    [
        ("default", "#### 3", "3", {}, 1.0),
        ("tiny_arithmetic", "3", "3", {}, 1.0),
        ("gsm8k", "3", "3", {"method": "flexible"}, 1.0),
        ("math", r"\boxed{3}", "3", {}, 1.0),
        ("exact_match", "A", "a", {"case_sensitive": False}, 1.0),
        ("format", "<think>a</think><answer>b</answer>", None, {}, 1.0),
        ("keyword", "red green", None, {"keywords": ["red", "blue"]}, 0.5),
    ],
)
def test_registered_functions_share_the_uniform_signature(
    name, solution, ground_truth, kwargs, expected
):
    data_source = "gsm8k" if name == "default" else "any_source"
    assert get_reward_fn(name)(data_source, solution, ground_truth, None, **kwargs) == expected


def test_registered_dict_rewards():
    sql = get_reward_fn("sql_safety")("s", "SELECT * FROM t", None, {"allowed_tables": ["u"]})
    assert sql["tables_allowed"] == 0
    code = get_reward_fn("code_exec")("s", "def f():\n    return 1", {"assert": "assert f() == 1"})
    assert code["score"] == 1.0


def test_unknown_name_lists_the_registered_ones():
    with pytest.raises(KeyError, match="registered: default, tiny_arithmetic, gsm8k"):
        get_reward_fn("nope")


def test_register_rejects_a_second_function_under_a_taken_name():
    with pytest.raises(ValueError, match="already registered as 'gsm8k'"):

        @register_reward_fn("gsm8k")
        def other(data_source, solution_str, ground_truth, extra_info=None):
            return 0.0


def test_package_import_stays_light_and_exports_the_manager_lazily():
    import subprocess
    import sys

    code = (
        "import sys, engine.rewards as r\n"
        "light = 'torch' not in sys.modules\n"
        "from engine.rewards import RewardManager\n"
        "print(light, RewardManager.__module__)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True", "engine.rewards.manager"]


def test_every_registered_reward_is_listed_and_every_listed_one_registered():
    from engine.rewards.names import REWARD_COMPONENTS, REWARD_FN_NAMES

    assert sorted(list_reward_fns()) == sorted(REWARD_FN_NAMES)
    assert (*REWARD_FN_NAMES, "reward_model", "custom") == REWARD_COMPONENTS


def test_registering_an_unlisted_reward_fails_and_names_the_list():
    with pytest.raises(ValueError, match=r"'bleu' is not listed; add it to .*\.REWARD_FN_NAMES"):
        register_reward_fn("bleu")(lambda *args, **kwargs: 0.0)
    assert "bleu" not in list_reward_fns()
