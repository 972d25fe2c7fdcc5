"""``python -m engine.eval``: ``--max-samples`` and the errors for arguments it cannot use.

The scores themselves are checked in ``tests/engine/trainer/test_eval_and_api.py``.
"""

from __future__ import annotations

import json

import pytest

from engine.config import load_config
from engine.data.dataset import RLHFDataset
from engine.eval import evaluate, load_prompts, main
from engine.roles.model_loading import load_tokenizer

SHORT = ["--max-prompt-length", "16", "--max-response-length", "8"]


@pytest.fixture(scope="module")
def tokenizer(tiny_assets):
    return load_tokenizer(load_config("grpo_tiny.yaml").actor_rollout_ref.model)


def row_indices(dataset: RLHFDataset) -> list[int]:
    return [row["index"] for row in dataset.rows]


def test_max_samples_draws_the_prompts_val_max_samples_validates(tiny_assets, tokenizer, tmp_path):
    from engine.trainer import PPOTrainer

    overrides = ["data.val_max_samples=7", f"trainer.default_local_dir={tmp_path}"]
    config = load_config("grpo_tiny.yaml", overrides=[*overrides, "trainer.logger=[]"])
    validated = PPOTrainer(config).val_dataset  # the prompts a run validates on
    options = dict(max_prompt_length=16, data_key_map={}, seed=config.data.seed)
    scored = load_prompts([str(tiny_assets.val_parquet)], tokenizer, max_samples=7, **options)
    assert row_indices(scored) == row_indices(validated)
    assert len(scored) == 7
    assert row_indices(scored) != list(range(7))  # a seeded draw, not the first rows
    other_seed = load_prompts(
        [str(tiny_assets.val_parquet)], tokenizer, max_samples=7, **{**options, "seed": 2}
    )
    assert row_indices(other_seed) != row_indices(scored)
    # Without --max-samples, or with more than the file holds, every prompt is scored.
    every = load_prompts([str(tiny_assets.val_parquet)], tokenizer, max_samples=None, **options)
    assert row_indices(every) == list(range(200))
    more = load_prompts([str(tiny_assets.val_parquet)], tokenizer, max_samples=500, **options)
    assert row_indices(more) == list(range(200))


def test_max_samples_scores_that_many_prompts(tiny_assets, capsys):
    argv = ["--model", "tiny://model", "--data", "tiny://val.parquet", *SHORT]
    assert main([*argv, "--max-samples", "5", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["num_prompts"] == 5
    assert result["greedy_accuracy"] in {k / 5 for k in range(6)}  # the mean of five 0/1 scores
    # The same draw scored through the Python API gives the same figure.
    again = evaluate(
        "tiny://model",
        ["tiny://val.parquet"],
        max_prompt_length=16,
        max_response_length=8,
        max_samples=5,
    )
    assert again["greedy_accuracy"] == result["greedy_accuracy"]


@pytest.fixture(scope="module")
def data_files(tmp_path_factory):
    """Return small files the checks refuse: a JSONL without a prompt column and a .txt."""
    folder = tmp_path_factory.mktemp("data")
    questions = folder / "questions.jsonl"
    questions.write_text(json.dumps({"question": "1+2=", "answer": "3"}) + "\n")
    text = folder / "notes.txt"
    text.write_text("1+2=\n")
    return {"questions": str(questions), "text": str(text), "missing": str(folder / "no.parquet")}


BAD_ARGUMENTS = {
    "n 0": (["--n", "0"], ["--n must be at least 1, got 0", "1 scores greedy answers only"]),
    "batch size 0": (["--batch-size", "0"], ["--batch-size must be at least 1, got 0"]),
    "negative batch size": (["--batch-size", "-3"], ["--batch-size must be at least 1, got -3"]),
    "max samples 0": (
        ["--max-samples", "0"],
        ["--max-samples must be at least 1, got 0", "leave it out to score them all"],
    ),
    "max samples -1": (["--max-samples", "-1"], ["--max-samples must be at least 1, got -1"]),
    "max prompt length 0": (
        ["--max-prompt-length", "0"],
        ["--max-prompt-length must be at least 1"],
    ),
    "max response length 0": (
        ["--max-response-length", "0"],
        ["--max-response-length must be at least 1"],
    ),
    "sampling at temperature 0": (
        ["--n", "4", "--temperature", "0"],
        ["--temperature must be above 0 with --n 4", "--temperature 1.0, or --n 1"],
    ),
    "key map not JSON": (["--key-map", "prompt=question"], ["--key-map is not JSON", "e.g."]),
    "key map not an object": (["--key-map", "[1]"], ["--key-map must be a JSON object"]),
    "key map unknown target": (
        ["--key-map", '{"question": "prompt"}'],
        ["--key-map has unknown target(s) ['question']", "'prompt', 'ground_truth'"],
    ),
}


@pytest.mark.parametrize("case", list(BAD_ARGUMENTS))
def test_a_bad_argument_is_named_with_its_fix(tiny_assets, capsys, case):
    extra, expected = BAD_ARGUMENTS[case]
    argv = ["--model", "tiny://model", "--data", "tiny://val.parquet", *SHORT, *extra]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1  # one line, no traceback
    for text in expected:
        assert text in err


def test_data_files_that_cannot_be_scored_are_named_with_the_fix(tiny_assets, data_files, capsys):
    def error(*argv: str) -> str:
        assert main(["--model", "tiny://model", *SHORT, *argv]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and "Traceback" not in err
        return err

    err = error("--data", "tiny://val.parquet", data_files["missing"])
    assert f"--data {data_files['missing']}: no such file" in err
    assert "pass existing parquet, JSON Lines or CSV files" in err
    err = error("--data", data_files["questions"])
    assert f"--data: {data_files['questions']}, line 1 has no column" in err
    assert "no column 'prompt' for the prompt (columns: ['question', 'answer'])" in err
    assert """--key-map '{"prompt": "<column>"}'""" in err
    err = error("--data", data_files["questions"], "--key-map", '{"prompt": "query"}')
    assert "no column 'query' for the prompt" in err
    mapped = '{"prompt": "question", "ground_truth": "solution"}'
    err = error("--data", data_files["questions"], "--key-map", mapped)
    assert "no column 'solution' for the ground_truth" in err
    assert """--key-map '{"ground_truth": "<column>"}'""" in err
    err = error("--data", data_files["text"])
    assert "--data: " in err and "unsupported file type '.txt'" in err
    err = error("--data", "tiny://nothing")
    assert "--data tiny://nothing: unknown embedded asset" in err


def test_a_mapped_prompt_column_is_scored(tiny_assets, data_files, capsys):
    argv = ["--model", "tiny://model", "--data", data_files["questions"], *SHORT, "--json"]
    assert main([*argv, "--key-map", '{"prompt": "question", "ground_truth": "answer"}']) == 0
    assert json.loads(capsys.readouterr().out)["num_prompts"] == 1


def test_cuda_without_a_gpu_names_the_flag(tiny_assets, capsys):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is visible")
    argv = ["--model", "tiny://model", "--data", "tiny://val.parquet", "--device", "cuda"]
    assert main(argv) == 2
    assert "--device cuda: no CUDA GPU is visible; use --device cpu" in capsys.readouterr().err


def test_a_runs_per_file_maps_score_an_upload_beside_the_tiny_validation_set(
    tiny_assets, data_files
):
    """A run that read its upload with its own key map is evaluated on the same terms."""
    upload = data_files["questions"]
    result = evaluate(
        "tiny://model",
        [upload, "tiny://val.parquet"],
        max_prompt_length=16,
        max_response_length=8,
        max_samples=4,
        file_key_maps={upload: {"prompt": "question", "ground_truth": "answer"}},
        file_data_sources={upload: "tiny_arithmetic"},
    )
    assert result["num_prompts"] == 4
    named = " ".join(result["greedy"])
    assert "tiny_arithmetic" in named and "questions" not in named, named
