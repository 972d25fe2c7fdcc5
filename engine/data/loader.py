"""A resumable prompt loader: one deterministic permutation per epoch.

Epoch ``e`` visits the dataset in the order ``torch.randperm(n, generator=seed + e)``, so the
order depends only on (seed, epoch) and a checkpoint needs three integers to resume exactly:
``{"epoch", "position", "seed"}``. Iterating the loader yields the rest of the current epoch and
then moves to the next; the position advances as each batch is handed out, so a state saved
after a training step resumes with the batch that would have come next.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch


class PromptDataLoader:
    """Batches of ``batch_size`` dataset items passed through ``collate_fn``, epoch by epoch."""

    def __init__(
        self,
        dataset: Any,
        batch_size: int,
        *,
        shuffle: bool = True,
        seed: int = 1,
        drop_last: bool = True,
        collate_fn: Callable[[Sequence[Any]], Any],
    ) -> None:
        if batch_size <= 0:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        size = len(dataset)
        if size == 0:
            raise ValueError("the dataset has no prompts; add rows to data.train_files")
        if size < batch_size:
            # A five-line tutorial file with train_batch_size=8 still trains: each epoch is one
            # batch holding every prompt, some twice (each repeat samples its own group).
            warnings.warn(
                f"the dataset has {size} prompts, fewer than one batch of {batch_size}: every "
                f"batch repeats prompts (an epoch is one batch); lower data.train_batch_size to "
                f"at most {size} to see each prompt once per step",
                UserWarning,
                stacklevel=2,
            )
        self.dataset = dataset
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.collate_fn = collate_fn
        self.epoch = 0
        self.position = 0  # batches already handed out in self.epoch

    def __len__(self) -> int:
        """Return the number of batches per epoch (one when the dataset is smaller than a batch)."""
        if len(self.dataset) < self.batch_size:
            return 1
        full, rest = divmod(len(self.dataset), self.batch_size)
        return full + (1 if rest and not self.drop_last else 0)

    def epoch_order(self, epoch: int) -> list[int]:
        """Return the dataset indices in the order epoch ``epoch`` visits them."""
        if not self.shuffle:
            return list(range(len(self.dataset)))
        generator = torch.Generator().manual_seed(self.seed + epoch)
        return torch.randperm(len(self.dataset), generator=generator).tolist()

    def __iter__(self) -> Iterator[Any]:
        """Yield the remaining batches of the current epoch, then advance to the next epoch."""
        epoch, num_batches = self.epoch, len(self)
        order = self.epoch_order(epoch)
        if len(order) < self.batch_size:  # one batch: the permutation, repeated to fill it
            order = (order * -(-self.batch_size // len(order)))[: self.batch_size]
        for step in range(self.position, num_batches):
            indices = order[step * self.batch_size : (step + 1) * self.batch_size]
            batch = self.collate_fn([self.dataset[i] for i in indices])
            if step + 1 == num_batches:
                self.epoch, self.position = epoch + 1, 0
            else:
                self.position = step + 1
            yield batch

    def state_dict(self) -> dict[str, int]:
        """Return the position to resume from: ``{"epoch", "position", "seed"}``."""
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Resume at a position saved by ``state_dict``."""
        missing = {"epoch", "position", "seed"} - set(state)
        if missing:
            raise ValueError(f"loader state is missing {sorted(missing)}; got {sorted(state)}")
        if not 0 <= int(state["position"]) < len(self):
            raise ValueError(
                f"loader state position {state['position']} is outside this loader's "
                f"{len(self)} batches per epoch; the dataset or data.train_batch_size changed "
                "since the checkpoint, so resume from a matching checkpoint or start afresh"
            )
        self.epoch, self.position, self.seed = (
            int(state["epoch"]),
            int(state["position"]),
            int(state["seed"]),
        )


# The name verl tutorials import (``from engine.data import RLDataLoader``).
RLDataLoader = PromptDataLoader
