"""data.custom_cls and data.sampler: a dataset and a sampler class from the user's Python files.

Loading (each failure names its key and the fix), verl's rows made into prompts, and the loader
drawing a sampler's order batch by batch, resumed with the sampler's state.
"""

from __future__ import annotations

import functools
import textwrap
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from engine.config.fields import ConfigFieldError
from engine.data.custom import (
    CustomPrompts,
    build_custom_dataset,
    build_sampler,
    dataset_class,
)
from engine.data.dataset import RLHFDataset, collate_prompts
from engine.data.loader import PromptDataLoader
from engine.data.rows import DatasetError
from engine.data.sampler import AbstractCurriculumSampler, AbstractSampler, is_curriculum
from tests.engine.data.helpers import TEMPLATE_TOKENS, data_config, verl_row, write_jsonl

ROWS_DATASET = """
from torch.utils.data import Dataset


class Rows(Dataset):
    def __init__(self, data_files, tokenizer, processor, config, max_samples=-1):
        self.data_files, self.config, self.max_samples = data_files, config, max_samples
        self.rows = [
            {"raw_prompt": [{"role": "user", "content": "1+1="}], "data_source": "sums",
             "reward_model": {"ground_truth": "2"}, "extra_info": {"split": "x"}, "index": 7},
            {"question": "2+2=", "reward_model": {"ground_truth": "4"}, "level": 3},
        ]

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return self.rows[i]
"""


def write(tmp_path: Path, source: str, name: str = "custom.py") -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(source))
    return str(path)


def build(cls, tokenizer, **settings):
    config = data_config(**settings)
    return build_custom_dataset(
        cls,
        ["a.jsonl"],
        tokenizer,
        OmegaConf.create({"seed": 3}),
        max_samples=5,
        prompt_settings=config,
    )


# -- loading: every failure names the key and the fix ------------------------------------------
def failure(call) -> ConfigFieldError:
    with pytest.raises(ConfigFieldError) as caught:
        call()
    return caught.value


def test_a_missing_file_names_the_path_key(tmp_path):
    error = failure(lambda: dataset_class(str(tmp_path / "nope.py"), "Rows"))
    assert error.key == "data.custom_cls.path"
    assert "is not a file; point it at the Python file defining the class" in error.message


def test_a_missing_class_names_the_classes_the_file_defines(tmp_path):
    path = write(tmp_path, ROWS_DATASET)
    error = failure(lambda: dataset_class(path, "Row"))
    assert error.key == "data.custom_cls.name"
    assert error.message.endswith("defines no 'Row'; its classes: Dataset, Rows")


def test_a_class_of_the_wrong_kind_is_refused(tmp_path):
    path = write(tmp_path, "class Plain:\n    pass\n\ndef Rows():\n    pass\n")
    for name in ("Plain", "Rows"):
        error = failure(lambda name=name: dataset_class(path, name))
        assert error.key == "data.custom_cls.name"
        assert "is not a subclass of torch.utils.data.dataset.Dataset; derive it from Dataset" in (
            error.message
        )
    error = failure(
        lambda: build_sampler(path, "Plain", [], None)  # a sampler must be a torch Sampler
    )
    assert error.key == "data.sampler.class_name"
    assert "derive it from Sampler" in error.message


def test_a_file_that_fails_to_import_names_the_error(tmp_path):
    path = write(tmp_path, "import not_a_module_anywhere\n")
    error = failure(lambda: build_sampler(path, "S", [], None))
    assert error.key == "data.sampler.class_path"
    assert "failed to import: ModuleNotFoundError: No module named 'not_a_module_anywhere'" in (
        error.message
    )


def test_a_failing_constructor_names_verls_call(tmp_path, char_tokenizer):
    path = write(
        tmp_path,
        """
        from torch.utils.data import Dataset

        class Old(Dataset):
            def __init__(self, data_files, tokenizer, config):  # no processor, no max_samples
                pass
        """,
    )
    error = failure(lambda: build(dataset_class(path, "Old"), char_tokenizer))
    assert error.key == "data.custom_cls.name"
    assert "Old could not be built for ['a.jsonl']: TypeError:" in error.message
    assert "processor=None, config=..., max_samples=...)" in error.message
    path = write(
        tmp_path,
        """
        from engine.data.sampler import AbstractSampler

        class Picky(AbstractSampler):
            def __init__(self, data_source, data_config):
                raise ValueError("needs a difficulty column")
        """,
        "picky.py",
    )
    error = failure(lambda: build_sampler(path, "Picky", [], None))
    assert error.key == "data.sampler.class_name"
    assert "Picky could not be built: ValueError: needs a difficulty column" in error.message


# -- verl's rows become prompts -----------------------------------------------------------------
def test_verl_rows_are_rendered_and_keep_their_fields(tmp_path, char_tokenizer):
    cls = dataset_class(write(tmp_path, ROWS_DATASET), "Rows")
    dataset = build(cls, char_tokenizer, prompt_key="question")
    assert isinstance(dataset, CustomPrompts)
    # Built as verl builds it: the files, verl's DictConfig, max_samples.
    assert dataset.source.data_files == ["a.jsonl"]
    assert dataset.source.config.get("seed") == 3 and dataset.source.max_samples == 5
    first, second = dataset[0], dataset[1]
    assert first["prompt_text"] == "<bos><|user|>1+1=<|assistant|>"
    assert len(first["input_ids"]) == len("1+1=") + TEMPLATE_TOKENS
    assert (first["data_source"], first["index"]) == ("sums", 7)
    assert first["reward_model"]["ground_truth"] == "2"
    assert first["extra_info"] == {"split": "x"}
    # No raw_prompt: the data.prompt_key column; no data_source: the class's name.
    assert second["raw_prompt"] == [{"role": "user", "content": "2+2="}]
    assert (second["data_source"], second["index"], second["extra_info"]) == (
        "Rows",
        1,
        {"level": 3},
    )
    batch = collate_prompts([first, second], char_tokenizer.pad_token_id)
    assert list(batch.non_tensor_batch["data_source"]) == ["sums", "Rows"]


def test_a_long_prompt_or_a_row_that_is_no_dict_is_a_clear_error(tmp_path, char_tokenizer):
    cls = dataset_class(write(tmp_path, ROWS_DATASET), "Rows")
    with pytest.raises(
        DatasetError,
        match=r"data.custom_cls Rows\[0\]: prompt is 7 tokens, "
        r"longer than data.max_prompt_length=5; raise",
    ):
        build(cls, char_tokenizer, max_prompt_length=5)[0]
    assert (
        len(build(cls, char_tokenizer, max_prompt_length=5, truncation="left")[0]["input_ids"]) == 5
    )
    dataset = build(cls, char_tokenizer)
    dataset.source.rows[0] = "1+1="
    with pytest.raises(DatasetError, match=r"Rows\[0\] is a str, not a dict; return verl's row"):
        dataset[0]


def test_a_subclass_of_the_engines_dataset_is_used_as_it_is(tmp_path, char_tokenizer):
    data = write_jsonl(tmp_path / "d.jsonl", [verl_row("1+1=", "2"), verl_row("2+2=", "4")])
    path = write(
        tmp_path,
        """
        from engine.data import RLHFDataset

        class FirstOnly(RLHFDataset):
            def __init__(self, *args, **kwargs):
                super().__init__(*args, **kwargs)
                self.rows = self.rows[:1]
        """,
    )
    dataset = build_custom_dataset(
        dataset_class(path, "FirstOnly"),
        [str(data)],
        char_tokenizer,
        OmegaConf.create({"max_prompt_length": 64, "truncation": "error"}),
        max_samples=-1,
        prompt_settings=data_config(),
    )
    assert isinstance(dataset, RLHFDataset) and len(dataset) == 1
    assert dataset[0]["raw_prompt"][0]["content"] == "1+1="


# -- the loader draws the sampler's order -------------------------------------------------------
class Reversed(AbstractSampler):
    def __init__(self, data_source, data_config):
        self.size = len(data_source)

    def __iter__(self):
        return iter(range(self.size - 1, -1, -1))

    def __len__(self):
        return self.size


class Hardest(AbstractCurriculumSampler):
    """Yields the index with the highest score first, asking again after each batch."""

    def __init__(self, data_source, data_config):
        self.scores = [0.0] * len(data_source)
        self.updates = 0

    def __iter__(self):
        seen: set[int] = set()
        while len(seen) < len(self.scores):
            unseen = [i for i in range(len(self.scores)) if i not in seen]
            best = max(unseen, key=lambda i: (self.scores[i], -i))
            seen.add(best)
            yield best

    def __len__(self):
        return len(self.scores)

    def update(self, batch):
        self.updates += 1
        for i in batch:
            self.scores[i] = -1.0
        self.scores[len(self.scores) - 1 - self.updates] = 10.0

    def state_dict(self):
        return {"scores": list(self.scores), "updates": self.updates}

    def load_state_dict(self, state):
        self.scores, self.updates = list(state["scores"]), state["updates"]


def sampled_loader(sampler, n=6, batch_size=2):
    return PromptDataLoader(
        list(range(n)), batch_size, collate_fn=list, sampler=sampler(list(range(n)), None)
    )


def test_the_sampler_sets_the_order_and_the_batch_count():
    loader = sampled_loader(Reversed, n=7)
    assert len(loader) == 3
    assert list(loader) == [[6, 5], [4, 3], [2, 1]]
    assert loader.state_dict() == {"epoch": 1, "position": 0, "seed": 1}


def test_a_curriculum_update_decides_the_batches_after_it():
    loader = sampled_loader(Hardest)
    batches = iter(loader)
    first = next(batches)
    loader.sampler.update(first)  # what the trainer does after each step
    assert first == [0, 1] and next(batches) == [4, 2]


def test_a_resume_restores_the_samplers_state_and_skips_the_batches_handed_out():
    loader = sampled_loader(Reversed, n=7)
    assert next(iter(loader)) == [6, 5]
    resumed = sampled_loader(Reversed, n=7)
    resumed.load_state_dict(loader.state_dict())
    assert list(resumed) == [[4, 3], [2, 1]]
    curriculum = sampled_loader(Hardest)
    curriculum.sampler.update([0, 1])
    state = curriculum.state_dict()
    assert state["sampler"] == {"scores": [-1.0, -1.0, 0.0, 0.0, 10.0, 0.0], "updates": 1}
    again = sampled_loader(Hardest)
    again.load_state_dict(state)
    assert again.sampler.scores == curriculum.sampler.scores and again.sampler.updates == 1


def test_a_sampler_that_yields_too_little_or_outside_the_dataset_is_refused():
    class Short(Reversed):
        def __iter__(self):
            return iter([0])

    class Outside(Reversed):
        def __iter__(self):
            return iter([0, 99])

    with pytest.raises(ValueError, match=r"yielded 1 indices for an epoch, fewer than one batch"):
        list(sampled_loader(Short))
    with pytest.raises(ValueError, match=r"yielded index 99, outside the dataset's 6 rows"):
        list(sampled_loader(Outside))


def test_rows_of_a_custom_dataset_flow_through_the_loader(tmp_path, char_tokenizer):
    cls = dataset_class(write(tmp_path, ROWS_DATASET), "Rows")
    dataset = build(cls, char_tokenizer, prompt_key="question")
    loader = PromptDataLoader(
        dataset,
        2,
        collate_fn=functools.partial(collate_prompts, pad_token_id=char_tokenizer.pad_token_id),
        sampler=Reversed(dataset.source, None),
    )
    (batch,) = list(loader)
    assert list(batch.non_tensor_batch["data_source"]) == ["Rows", "sums"]


def test_verls_module_spellings_load_a_file_or_an_importable_module(tmp_path):
    path = write(tmp_path, ROWS_DATASET)
    assert dataset_class(f"file://{path}", "Rows").__name__ == "Rows"
    # verl's curriculum examples name a module of its tests: pkg://tests.utils.dataset...
    for spelling in (
        "pkg://tests.engine.data.test_custom_classes",
        "pkg://tests/engine/data/test_custom_classes",
    ):
        sampler = build_sampler(spelling, "Reversed", [1, 2, 3], None)
        assert list(sampler) == [2, 1, 0]
    error = failure(lambda: build_sampler("pkg://../rewards/evil", "Reversed", [], None))
    assert (error.key, error.message) == (
        "data.sampler.class_path",
        "pkg:// names a module by its dotted name, e.g. pkg://my_pkg.samplers",
    )
    error = failure(lambda: dataset_class("pkg://no_such_module_here", "Rows"))
    assert error.key == "data.custom_cls.path"
    assert "module no_such_module_here failed to import: ModuleNotFoundError" in error.message


def test_a_curriculum_sampler_is_ours_or_verls():
    class AbstractCurriculumSampler(AbstractSampler):  # verl's, where verl is installed
        pass

    class VerlCurriculum(AbstractCurriculumSampler):
        def __init__(self, data_source, data_config):
            pass

    assert is_curriculum(VerlCurriculum([], None)) and is_curriculum(Hardest([], None))
    assert not is_curriculum(Reversed([], None)) and not is_curriculum(None)
