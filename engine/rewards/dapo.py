"""verl's DAPO reward manager (``reward_model.reward_manager=dapo``): the naive manager's scores,
each float score recorded as ``acc`` (what ``algorithm.filter_groups.metric=acc`` reads), and
the overlong penalty of :mod:`engine.rewards.overlong` added to the reward on the last token.

With ``overlong_buffer_cfg.log`` the reward info carries verl's ``overlong_reward`` (the penalty)
and ``overlong`` (whether it was below 0) per response. ``score`` stays the reward function's own
score; the reward tensor (and so ``seq_reward``) holds score plus penalty.
"""

from __future__ import annotations

from typing import Any

import torch

from engine.algorithms.torch_functional import mask_span_end
from engine.rewards.manager import RewardManager
from engine.rewards.overlong import OverlongBuffer


class DAPORewardManager(RewardManager):
    """Score a rollout batch as :class:`RewardManager`, then apply DAPO's overlong penalty."""

    def __init__(self, tokenizer: Any, *, overlong: OverlongBuffer | None = None, **kwargs: Any):
        super().__init__(tokenizer, **kwargs)
        self.overlong = overlong

    def __call__(self, data: Any, return_dict: bool = False) -> torch.Tensor | dict[str, Any]:
        """Return the reward tensor ``(bs, response_len)``, or a dict with the extra info."""
        result: dict[str, Any] = super().__call__(data, return_dict=True)  # type: ignore[assignment]
        rewards = result["reward_tensor"]  # (bs, R)
        extra = result["reward_extra_info"]
        bs = rewards.shape[0]
        # verl's DAPO manager records a float score as acc; a dict result keeps its own keys.
        acc = extra.setdefault("acc", [None] * bs)
        for i in range(bs):
            if acc[i] is None and extra["reward_error"][i] is None:
                acc[i] = extra["score"][i]
        if self.overlong is not None:
            lengths = mask_span_end(self._response_mask(data))  # (bs,)
            penalties = [self.overlong.penalty(int(n)) for n in lengths.tolist()]
            for i, (length, penalty) in enumerate(zip(lengths.tolist(), penalties, strict=True)):
                if length > 0:
                    rewards[i, int(length) - 1] += penalty
            if self.overlong.log:
                extra["overlong_reward"] = penalties
                extra["overlong"] = [p < 0 for p in penalties]
        return result if return_dict else rewards

    @staticmethod
    def _response_mask(data: Any) -> torch.Tensor:
        if "response_mask" in data.batch:
            return data.batch["response_mask"]  # (bs, R)
        return data.batch["attention_mask"][:, -data.batch["responses"].shape[1] :]  # (bs, R)
