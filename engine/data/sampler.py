"""The interface of a sampler named by ``data.sampler.class_path`` / ``class_name``, as verl's
``verl.experimental.dataset.sampler``.

A sampler chooses the training order: the loader builds it as
``cls(data_source=<the training dataset>, data_config=<the data section>)`` and draws its
indices batch by batch, so what an :class:`AbstractCurriculumSampler` learns in ``update`` (called
with each step's batch, after the step) decides the batches that come after it. A file written for
verl imports these two classes from ``engine.data.sampler`` instead, or keeps verl's where verl is
installed: any ``torch.utils.data.Sampler`` is taken, and verl's curriculum class is one too
(:func:`is_curriculum`).
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sized
from typing import TYPE_CHECKING, Any

from torch.utils.data import Sampler

if TYPE_CHECKING:
    from engine.data.proto import DataProto


class AbstractSampler(Sampler[int]):
    """A sampler built from the training dataset and the ``data`` section."""

    @abstractmethod
    def __init__(self, data_source: Sized, data_config: Any):
        """``data_source``: the training dataset; ``data_config``: the ``data`` section."""


class AbstractCurriculumSampler(AbstractSampler):
    """A sampler that learns from the training: ``update`` gets each step's batch."""

    @abstractmethod
    def update(self, batch: DataProto) -> None:
        """Take in a finished step's batch (prompts, responses, rewards, advantages)."""


def is_curriculum(sampler: object) -> bool:
    """Return True for a curriculum sampler: a subclass of this module's
    :class:`AbstractCurriculumSampler` or of verl's class of that name."""
    return any(cls.__name__ == "AbstractCurriculumSampler" for cls in type(sampler).__mro__)
