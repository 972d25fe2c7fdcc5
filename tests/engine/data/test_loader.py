"""PromptDataLoader: deterministic epochs, exact resume, batch counts and size errors."""

import functools

import pytest
import torch

from engine.data.dataset import RLHFDataset, collate_prompts
from engine.data.loader import PromptDataLoader
from tests.engine.data.helpers import data_config, write_jsonl


def loader(n: int = 10, batch_size: int = 3, **kwargs) -> PromptDataLoader:
    return PromptDataLoader(list(range(n)), batch_size, collate_fn=list, **kwargs)


def take(data_loader: PromptDataLoader, count: int) -> list[list[int]]:
    """Return the next ``count`` batches, crossing epochs as a trainer loop would."""
    batches: list[list[int]] = []
    while len(batches) < count:
        for batch in data_loader:
            batches.append(batch)
            if len(batches) == count:
                break
    return batches


def test_epoch_is_the_seeded_permutation():
    data_loader = loader(seed=7)
    order = torch.randperm(10, generator=torch.Generator().manual_seed(7)).tolist()
    assert list(data_loader) == [order[0:3], order[3:6], order[6:9]]  # drop_last drops 1
    next_order = torch.randperm(10, generator=torch.Generator().manual_seed(8)).tolist()
    assert list(data_loader)[0] == next_order[0:3]
    assert data_loader.state_dict() == {"epoch": 2, "position": 0, "seed": 7}


def test_same_seed_same_batches_and_epochs_differ():
    first, second = take(loader(seed=3), 6), take(loader(seed=3), 6)
    assert first == second
    assert first[:3] != first[3:]
    assert all(len(set(sum(epoch, []))) == 9 for epoch in (first[:3], first[3:]))
    assert take(loader(seed=4), 3) != first[:3]


def test_no_shuffle_and_keep_last():
    data_loader = loader(shuffle=False, drop_last=False)
    assert len(data_loader) == 4
    assert list(data_loader) == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]


@pytest.mark.parametrize("stop_after", [1, 2, 3, 4, 7])
def test_resume_yields_what_the_uninterrupted_loader_would(stop_after):
    uninterrupted = take(loader(seed=5), 9)
    interrupted = loader(seed=5)
    seen = take(interrupted, stop_after)
    state = interrupted.state_dict()
    resumed = loader(seed=0)
    resumed.load_state_dict(dict(state))
    assert seen + take(resumed, 9 - stop_after) == uninterrupted


def test_state_after_a_partial_epoch():
    data_loader = loader()
    take(data_loader, 2)
    assert data_loader.state_dict() == {"epoch": 0, "position": 2, "seed": 1}
    assert len(list(data_loader)) == 1  # the rest of epoch 0


def test_bad_state_is_rejected():
    with pytest.raises(ValueError, match=r"missing \['seed'\]"):
        loader().load_state_dict({"epoch": 0, "position": 0})
    with pytest.raises(ValueError, match="position 5 is outside this loader's 3 batches"):
        loader().load_state_dict({"epoch": 0, "position": 5, "seed": 1})


def test_a_dataset_smaller_than_one_batch_fills_each_batch_by_repeating_its_prompts():
    # A tutorial's five-line file with train_batch_size=8 trains, with a warning: each epoch is
    # one batch holding every prompt, the permutation repeated (prompts 3 and 4 twice here).
    with pytest.warns(UserWarning, match=r"has 5 prompts, fewer than one batch of 8.*at most 5"):
        data_loader = loader(n=5, batch_size=8, shuffle=False)
    assert len(data_loader) == 1
    assert take(data_loader, 2) == [[0, 1, 2, 3, 4, 0, 1, 2]] * 2
    assert data_loader.state_dict() == {"epoch": 2, "position": 0, "seed": 1}
    with pytest.warns(UserWarning):
        shuffled = take(loader(n=5, batch_size=8), 1)[0]
    assert len(shuffled) == 8 and set(shuffled) == set(range(5))
    with pytest.raises(ValueError, match="the dataset has no prompts"):
        loader(n=0)
    with pytest.raises(ValueError, match="batch_size must be positive"):
        loader(batch_size=0)


def test_loader_over_rlhf_dataset(tmp_path, char_tokenizer):
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "a" * (i + 1)} for i in range(4)])
    dataset = RLHFDataset(str(path), char_tokenizer, data_config())
    collate = functools.partial(collate_prompts, pad_token_id=char_tokenizer.pad_token_id)
    batches = list(PromptDataLoader(dataset, 2, shuffle=False, collate_fn=collate))
    assert [list(b.non_tensor_batch["index"]) for b in batches] == [[0, 1], [2, 3]]
    assert batches[1].batch["input_ids"].shape == (2, 4 + 3)
