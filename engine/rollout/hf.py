"""The ``hf`` rollout backend: batched generation with a Hugging Face causal LM on CPU or GPU.

In the hybrid engine the rollout holds the *same module* as the actor, so weight sync is free in
a single process; the distributed workers load gathered weights into it instead.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from engine.data import DataProto
from engine.rollout.sampling import TOKEN_VERSIONS, sample_sequences

if TYPE_CHECKING:
    from engine.config import RolloutConfig


def eos_token_ids(tokenizer: Any, model: torch.nn.Module) -> list[int]:
    """Return every id that ends a response: the tokenizer's EOS and the generation config's."""
    ids: set[int] = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    generation_config = getattr(model, "generation_config", None)
    configured = getattr(generation_config, "eos_token_id", None)
    if isinstance(configured, int):
        ids.add(configured)
    elif configured:
        ids.update(int(i) for i in configured)
    if not ids:
        raise ValueError("the tokenizer has no eos_token; set one so responses can end")
    return sorted(ids)


class HFRollout:
    """Generate ``responses`` for a batch of left-padded prompts."""

    def __init__(
        self, model: torch.nn.Module, tokenizer: Any, rollout_config: RolloutConfig
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.config = rollout_config
        self.eos_ids = eos_token_ids(tokenizer, model)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0

    def load_weights(self, model: torch.nn.Module) -> None:
        """Point the rollout at the given module (the actor's, after an update)."""
        self.model = model

    def generate_sequences(
        self,
        prompts: DataProto,
        *,
        max_new_tokens: int,
        sampling: dict[str, Any],
        generator: torch.Generator | None = None,
        version: int = 0,
        interrupt: Callable[[], int | None] | None = None,
    ) -> DataProto:
        """Return the response tensors for ``prompts`` (already repeated ``n`` times).

        Adds ``prompts`` (bs, P), ``responses`` (bs, T), ``response_mask`` (bs, T),
        ``input_ids`` / ``attention_mask`` / ``position_ids`` (bs, P + T),
        ``rollout_log_probs`` (bs, T), and the non-tensor ``truncated`` flags. A partial
        rollout (``interrupt``: ``sample_sequences``') adds ``rollout_token_versions`` (bs, T),
        the policy version each token was sampled under, starting at ``version``.
        """
        prompt_ids = prompts.batch["input_ids"]
        prompt_mask = prompts.batch["attention_mask"]
        was_training = self.model.training
        if was_training:  # ``eval()`` walks every submodule; skip it when already in eval mode
            self.model.eval()
        out = sample_sequences(
            self.model,
            prompt_ids,
            prompt_mask,
            max_new_tokens=max_new_tokens,
            eos_token_ids=self.eos_ids,
            pad_token_id=self.pad_id,
            generator=generator,
            version=version,
            interrupt=interrupt,
            **sampling,
        )
        if was_training:
            self.model.train()
        attention_mask = torch.cat([prompt_mask, out.response_mask], dim=-1)
        position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
        tensors = {
            "prompts": prompt_ids,
            "responses": out.responses,
            "response_mask": out.response_mask,
            "input_ids": torch.cat([prompt_ids, out.responses], dim=-1),
            "attention_mask": attention_mask,
            "position_ids": position_ids,
            "rollout_log_probs": out.log_probs,
        }
        if interrupt is not None:
            tensors[TOKEN_VERSIONS] = out.token_versions
        return DataProto.from_dict(tensors, {"truncated": out.truncated.cpu().numpy()})
