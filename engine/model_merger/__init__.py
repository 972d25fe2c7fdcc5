"""Merge a trainer checkpoint into a Hugging Face folder (verl's ``python -m verl.model_merger``).

See :mod:`engine.model_merger.merge` for the checkpoint layouts it reads,
:mod:`engine.model_merger.lora` for LoRA checkpoints and :mod:`engine.model_merger.__main__` for
the command line.
"""

from engine.model_merger.merge import (
    MergeError,
    compare_to_reference,
    load_merged_model,
    merge_checkpoint,
)

__all__ = ["MergeError", "compare_to_reference", "load_merged_model", "merge_checkpoint"]
