"""The judge's generator: a causal LM served by a rollout backend, judge prompts in, replies out.

The judge generates with the same backends as the policy (``engine.rollout``, by
``reward_model.rollout.name``): ``hf`` runs the engine's own batched sampler over a
transformers model loaded here, ``vllm`` builds a vLLM engine over the judge's folder with the
policy's rollout settings (``actor_rollout_ref.rollout``) but the judge's name, lengths and
``max_num_seqs``, and no sleep mode (the judge keeps its weights). Each judge prompt is the
user turn of the judge's chat template when its tokenizer has one (with the generation prompt),
else the text itself.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from engine.data import DataProto
from engine.rewards.judge import JudgeScorer
from engine.roles.model_loading import resolve_path
from engine.rollout import get_rollout_builder

if TYPE_CHECKING:
    from engine.config import PPOConfig, RolloutConfig


class JudgeGenerator:
    """Generate one reply per judge prompt with a rollout backend."""

    def __init__(
        self,
        model_path: str,
        rollout_config: RolloutConfig,
        *,
        backend: str = "hf",
        max_prompt_tokens: int = 2048,
        max_new_tokens: int = 2048,
        temperature: float = 0.0,
        device: str | torch.device = "cpu",
        seed: int = 0,
        trust_remote_code: bool = False,
    ) -> None:
        self.device = torch.device(device)
        self.tokenizer: Any = AutoTokenizer.from_pretrained(
            model_path, trust_remote_code=trust_remote_code
        )
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.tokenizer.padding_side = "left"
        model: Any = None
        if backend == "hf":
            dtype = torch.bfloat16 if self.device.type == "cuda" else torch.float32
            model = AutoModelForCausalLM.from_pretrained(
                model_path, dtype=dtype, trust_remote_code=trust_remote_code
            )
            model.to(self.device).eval()
        self.engine = get_rollout_builder(backend)(
            model, self.tokenizer, rollout_config, model_path, seed=seed
        )
        self.max_prompt_tokens = max_prompt_tokens
        self.max_new_tokens = max_new_tokens
        self.sampling = {
            "do_sample": temperature > 0,
            "temperature": float(temperature) if temperature > 0 else 1.0,
            "top_k": -1,
            "top_p": 1.0,
        }
        self.generator = torch.Generator(self.device).manual_seed(seed)
        self._has_template = bool(getattr(self.tokenizer, "chat_template", None))

    def prompt_ids(self, text: str) -> list[int]:
        """Return the token ids the judge reads for one judge prompt."""
        if not self._has_template:
            return list(self.tokenizer(text)["input_ids"])
        return list(
            self.tokenizer.apply_chat_template(
                [{"role": "user", "content": text}],
                add_generation_prompt=True,
                tokenize=True,
                return_dict=True,
            )["input_ids"]
        )

    @torch.no_grad()
    def __call__(self, texts: list[str]) -> list[str | BaseException]:
        """Return the judge's reply to each prompt (an error for a prompt that is too long)."""
        encoded = [self.prompt_ids(t) for t in texts]
        fits = [i for i, ids in enumerate(encoded) if len(ids) <= self.max_prompt_tokens]
        replies: list[str | BaseException] = [
            ValueError(
                f"the judge prompt has {len(ids)} tokens, over reward_model.rollout."
                f"prompt_length={self.max_prompt_tokens}; shorten the template or raise "
                "prompt_length"
            )
            for ids in encoded
        ]  # replaced below for the prompts that fit
        if not fits:
            return list(replies)
        width = max(len(encoded[i]) for i in fits)
        pad = self.tokenizer.pad_token_id
        input_ids = torch.tensor(  # (bs, P), left-padded
            [[pad] * (width - len(encoded[i])) + encoded[i] for i in fits], device=self.device
        )
        attention_mask = torch.tensor(  # (bs, P)
            [[0] * (width - len(encoded[i])) + [1] * len(encoded[i]) for i in fits],
            device=self.device,
        )
        out = self.engine.generate_sequences(
            DataProto.from_dict({"input_ids": input_ids, "attention_mask": attention_mask}),
            max_new_tokens=self.max_new_tokens,
            sampling=self.sampling,
            generator=self.generator,
        )
        responses = out.batch["responses"]  # (bs, T)
        mask = out.batch["response_mask"]  # (bs, T)
        for row, i in enumerate(fits):
            ids = responses[row][mask[row].bool()].tolist()
            replies[i] = str(self.tokenizer.decode(ids, skip_special_tokens=True))
        return list(replies)


def judge_rollout_config(config: PPOConfig) -> RolloutConfig:
    """Return the rollout settings the judge's backend reads: the policy's, with the judge's
    backend, lengths and sequences a step, and no sleep mode."""
    judge = config.reward_model.rollout
    return dataclasses.replace(
        config.actor_rollout_ref.rollout,
        name=judge.name or "hf",
        prompt_length=judge.prompt_length,
        response_length=judge.response_length,
        max_num_seqs=judge.max_num_seqs,
        enable_sleep_mode=False,
        free_cache_engine=False,
    )


def load_judge(config: PPOConfig, device: str | torch.device = "cpu") -> JudgeScorer:
    """Return the judge ``config.reward_model`` describes, generating on ``device``."""
    rm = config.reward_model
    model_path = resolve_path(rm.model.path)
    if model_path is None:
        raise ValueError(
            "reward_model.model.path is not set; point it at the judge's folder (a causal LM)"
        )
    rollout = judge_rollout_config(config)
    generate = JudgeGenerator(
        model_path,
        rollout,
        backend=rollout.name,
        max_prompt_tokens=rm.rollout.prompt_length,
        max_new_tokens=rm.rollout.response_length,
        temperature=rm.judge.temperature,
        device=device,
        seed=config.trainer.seed,
        trust_remote_code=rm.model.trust_remote_code,
    )
    return JudgeScorer(
        generate,
        template=str(rm.judge.prompt_template),
        parser=rm.judge.parser,
        verdicts=dict(rm.judge.verdicts),
        batch_size=rm.rollout.max_num_seqs,
        max_rpm=rm.max_rpm,
        max_tpm=rm.max_tpm,
        estimated_tokens_per_request=rm.estimated_tokens_per_request,
        timeout=rm.timeout,
    )
