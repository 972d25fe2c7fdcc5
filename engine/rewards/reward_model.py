"""A reward model: a sequence classifier with one label whose logit scores (prompt, response).

Any Hugging Face ``AutoModelForSequenceClassification`` folder works (for example a Qwen2 or
Llama reward model trained with a Bradley-Terry loss, Ouyang et al. 2022). The text scored is the
tokenizer's chat template over a user turn (the prompt) and an assistant turn (the response)
when the tokenizer has one, else the prompt followed by the response. A prompt may also be given
as chat messages (verl's ``raw_prompt``): the response is appended as the assistant turn and the
reward model's own template renders the conversation, so a policy and a reward model with
different chat templates each read their own (verl's ``_switch_chat_template``). Batches are
padded on the right, so a padded row reads the same positions as the row alone and batching does not change
the scores beyond float rounding.

Where it runs: with ``trainer.controller=local`` the trainer's process holds the scorer; with
``trainer.controller=ray`` every rank of the reward model's pool builds one (from the same
config, through ``engine.roles.model_loading.load_reward_model``), its classifier sharded with FSDP2,
and the controller's ``engine.distributed.worker_group.RewardModelGroup`` splits each batch over
them. The text each rank scores is made by the same :meth:`RewardModelScorer.format_text`.
``reward_model.model.fsdp_config.param_offload`` keeps the in-process scorer's parameters in CPU
memory between scorings (the Ray ranks offload through FSDP2 instead).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch


class RewardModelScorer:
    """Score (prompt, response) texts with a one-label sequence classifier."""

    def __init__(
        self,
        model_path: str | Path,
        tokenizer_path: str | Path | None = None,
        micro_batch_size: int = 8,
        device: str = "cpu",
        *,
        max_length: int = 2048,
        trust_remote_code: bool = False,
        offload: bool = False,
    ) -> None:
        """Load the classifier on ``device``; with ``offload`` (verl's
        ``reward_model.model.fsdp_config.param_offload``) its parameters stay in CPU memory and
        go to ``device`` only while :meth:`score` runs, giving the memory back to training."""
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        if micro_batch_size < 1:
            raise ValueError(f"micro_batch_size must be >= 1, got {micro_batch_size}")
        self.micro_batch_size = micro_batch_size
        self.max_length = max_length
        self.device = torch.device(device)
        self.tokenizer = AutoTokenizer.from_pretrained(
            str(tokenizer_path or model_path), trust_remote_code=trust_remote_code
        )
        self.model = AutoModelForSequenceClassification.from_pretrained(
            str(model_path), trust_remote_code=trust_remote_code
        )
        if self.model.config.num_labels != 1:
            raise ValueError(
                f"reward model {model_path} has num_labels={self.model.config.num_labels}; a "
                "reward model needs exactly one output (its logit is the score)"
            )
        if self.tokenizer.pad_token_id is None:
            if self.tokenizer.eos_token_id is None:
                raise ValueError(
                    f"tokenizer of {tokenizer_path or model_path} has neither a pad nor an eos "
                    "token; add a pad token so batches can be padded"
                )
            self.tokenizer.pad_token = self.tokenizer.eos_token
        if self.model.config.pad_token_id is None:
            # The classifier reads the logit at the last non-pad token.
            self.model.config.pad_token_id = self.tokenizer.pad_token_id
        self.tokenizer.padding_side = "right"
        # Truncate from the left: the end of the response is what the score is about.
        self.tokenizer.truncation_side = "left"
        self._has_template = bool(getattr(self.tokenizer, "chat_template", None))
        self.offload = offload
        self.model.to("cpu" if offload else self.device).eval()

    def format_text(self, prompt: str | Sequence[dict[str, Any]], response: str) -> str:
        """Return the text the model scores for one (prompt text or messages, response) pair."""
        if isinstance(prompt, str):
            if not self._has_template:
                return prompt + response
            messages = [{"role": "user", "content": prompt}]
        else:
            messages = [dict(m) for m in prompt]
            if not self._has_template:
                return "".join(str(m["content"]) for m in messages) + response
        messages.append({"role": "assistant", "content": response})
        return str(self.tokenizer.apply_chat_template(messages, tokenize=False))

    # no_grad rather than inference_mode: FSDP2 (the Ray path's sharded classifier) crashed
    # unsharding parameters under inference_mode in some torch releases (pytorch/pytorch#197327);
    # the scores are the same.
    @torch.no_grad()
    def score(
        self, prompts: Sequence[str | Sequence[dict[str, Any]]], responses: Sequence[str]
    ) -> list[float]:
        """Return one score per (prompt, response) pair, in order."""
        if len(prompts) != len(responses):
            raise ValueError(f"got {len(prompts)} prompts but {len(responses)} responses")
        texts = [self.format_text(p, r) for p, r in zip(prompts, responses, strict=True)]
        with self._on_device():
            return self._score_texts(texts)

    @contextmanager
    def _on_device(self) -> Iterator[None]:
        """Hold the parameters on the scoring device for the block (with ``offload``, only then)."""
        if not self.offload:
            yield
            return
        self.model.to(self.device)
        try:
            yield
        finally:
            self.model.to("cpu")
            if self.device.type == "cuda":
                torch.cuda.empty_cache()

    def _score_texts(self, texts: list[str]) -> list[float]:
        scores: list[float] = []
        for start in range(0, len(texts), self.micro_batch_size):
            enc = self.tokenizer(
                texts[start : start + self.micro_batch_size],
                return_tensors="pt",
                padding=True,
                truncation=True,
                max_length=self.max_length,
                # A chat template already writes the special tokens.
                add_special_tokens=not self._has_template,
            ).to(self.device)
            logits = self.model(
                input_ids=enc["input_ids"], attention_mask=enc["attention_mask"]
            ).logits  # (micro_bs, 1)
            scores.extend(logits[:, 0].float().cpu().tolist())
        return scores
