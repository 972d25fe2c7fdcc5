"""A resumable prompt loader: one deterministic permutation per epoch, or a sampler's order.

Epoch ``e`` visits the dataset in the order ``torch.randperm(n, generator=seed + e)``, so the
order depends only on (seed, epoch) and a checkpoint needs three integers to resume exactly:
``{"epoch", "position", "seed"}``. Iterating the loader yields the rest of the current epoch and
then moves to the next; the position advances as each batch is handed out, so a state saved
after a training step resumes with the batch that would have come next.

With a ``sampler`` (``data.sampler``, ``engine.data.custom``) each epoch is one pass of
``iter(sampler)``, its indices drawn a batch at a time as the batch is asked for, so a curriculum
sampler's ``update`` after a step decides the batches after it (as verl's loader with
``num_workers=0``). As verl's ``StatefulDataLoader``, a sampler with ``state_dict`` /
``load_state_dict`` has its state saved and restored with the position (tensors and plain
containers only: checkpoints load with ``weights_only``), and a resumed epoch draws again and
skips the batches already handed out.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator, Sequence
from itertools import islice
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
        sampler: Any = None,
    ) -> None:
        """``sampler``: an iterable of dataset indices that replaces ``shuffle`` and ``seed``."""
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
        self.sampler = sampler
        self.epoch = 0
        self.position = 0  # batches already handed out in self.epoch

    def epoch_size(self) -> int:
        """Return the indices an epoch visits: the sampler's length (where it has one), else the
        dataset's."""
        return len(self.sampler) if hasattr(self.sampler, "__len__") else len(self.dataset)

    def __len__(self) -> int:
        """Return the number of batches per epoch (one when the epoch is smaller than a batch)."""
        size = self.epoch_size()
        if size < self.batch_size:
            return 1
        full, rest = divmod(size, self.batch_size)
        return full + (1 if rest and not self.drop_last else 0)

    def epoch_order(self, epoch: int) -> list[int]:
        """Return the dataset indices in the order epoch ``epoch`` visits them."""
        if not self.shuffle:
            return list(range(len(self.dataset)))
        generator = torch.Generator().manual_seed(self.seed + epoch)
        return torch.randperm(len(self.dataset), generator=generator).tolist()

    def epoch_indices(self, epoch: int) -> Iterator[int]:
        """Return the indices epoch ``epoch`` visits, in order: the sampler's, drawn as they
        are asked for, else ``epoch_order``; an epoch smaller than a batch is repeated to fill
        one."""
        if self.sampler is None:
            order = self.epoch_order(epoch)
        elif self.epoch_size() < self.batch_size:
            order = list(self.sampler)
        else:
            return iter(self.sampler)
        if order and len(order) < self.batch_size:  # one batch: the order, repeated to fill it
            order = (order * -(-self.batch_size // len(order)))[: self.batch_size]
        return iter(order)

    def __iter__(self) -> Iterator[Any]:
        """Yield the remaining batches of the current epoch, then advance to the next epoch."""
        epoch, num_batches = self.epoch, len(self)
        indices = self.epoch_indices(epoch)
        for _ in islice(indices, self.position * self.batch_size):
            pass  # the batches handed out before a resume
        for step in range(self.position, num_batches):
            chosen = list(islice(indices, self.batch_size))
            if len(chosen) < self.batch_size and (self.drop_last or not chosen):
                # Only a sampler yielding fewer indices than its length ends an epoch early.
                if step == 0:
                    raise ValueError(
                        f"the sampler (data.sampler.class_name) yielded {len(chosen)} indices "
                        f"for an epoch, fewer than one batch of {self.batch_size}; yield at "
                        "least a batch of dataset indices per pass"
                    )
                self.epoch, self.position = epoch + 1, 0
                return
            if self.sampler is not None:
                outside = [i for i in chosen if not 0 <= i < len(self.dataset)]
                if outside:
                    raise ValueError(
                        f"the sampler (data.sampler.class_name) yielded index {outside[0]}, "
                        f"outside the dataset's {len(self.dataset)} rows"
                    )
            batch = self.collate_fn([self.dataset[i] for i in chosen])
            if step + 1 == num_batches:
                self.epoch, self.position = epoch + 1, 0
            else:
                self.position = step + 1
            yield batch

    def state_dict(self) -> dict[str, Any]:
        """Return the position to resume from: ``{"epoch", "position", "seed"}``, and the
        sampler's ``state_dict()`` under ``"sampler"`` where it has one."""
        state: dict[str, Any] = {"epoch": self.epoch, "position": self.position, "seed": self.seed}
        if callable(getattr(self.sampler, "state_dict", None)):
            state["sampler"] = self.sampler.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
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
        if "sampler" in state and callable(getattr(self.sampler, "load_state_dict", None)):
            self.sampler.load_state_dict(state["sampler"])


# The name verl tutorials import (``from engine.data import RLDataLoader``).
RLDataLoader = PromptDataLoader
