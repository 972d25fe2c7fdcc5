import pickle

import pytest

from engine.rewards.custom import load_custom_reward_fn

REWARD_SOURCE = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None, bonus=0.0):
    return float(solution_str == ground_truth) + bonus

def length_reward(data_source, solution_str, ground_truth, extra_info=None):
    return len(solution_str)

_private = 1
"""


@pytest.fixture
def reward_file(tmp_path):
    path = tmp_path / "my_reward.py"
    path.write_text(REWARD_SOURCE)
    return path


def test_loads_the_function_and_adds_reward_kwargs(reward_file):
    fn = load_custom_reward_fn(reward_file, reward_kwargs={"bonus": 0.5})
    assert fn("src", "a", "a") == 1.5
    assert fn("src", "a", "b") == 0.5
    assert load_custom_reward_fn(str(reward_file), name="length_reward")("s", "abc", None) == 3


def test_pickles_by_path_for_worker_processes(reward_file):
    fn = pickle.loads(pickle.dumps(load_custom_reward_fn(reward_file, reward_kwargs={"bonus": 1})))
    assert fn("src", "a", "a") == 2.0


def test_missing_file_names_the_path(tmp_path):
    missing = tmp_path / "nope.py"
    with pytest.raises(
        FileNotFoundError, match=r"nope\.py not found.*custom_reward_function\.path"
    ):
        load_custom_reward_fn(missing)


def test_missing_function_lists_what_the_module_has(reward_file):
    with pytest.raises(AttributeError) as info:
        load_custom_reward_fn(reward_file, name="score_it")
    message = str(info.value)
    assert "'score_it'" in message and "my_reward.py" in message
    assert "['compute_score', 'length_reward']" in message


def test_syntax_error_names_the_line(tmp_path):
    path = tmp_path / "broken.py"
    path.write_text("x = 1\n\ndef compute_score(:\n    pass\n")
    with pytest.raises(SyntaxError, match=r"broken\.py has a syntax error at line 3"):
        load_custom_reward_fn(path)


def test_import_error_names_the_line(tmp_path):
    path = tmp_path / "needs_pkg.py"
    path.write_text("import os\nimport package_that_is_not_installed\n")
    with pytest.raises(
        ImportError, match=r"needs_pkg\.py failed to load at line 2: ModuleNotFound"
    ):
        load_custom_reward_fn(path)
