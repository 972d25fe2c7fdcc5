"""Multi-turn rollout: the policy and an interaction take turns until the interaction stops.

``actor_rollout_ref.rollout.multi_turn.enable`` wraps the single-turn rollout (``hf`` or
``vllm``) in :class:`MultiTurnRollout`. The interaction is a plain Python function loaded from
``multi_turn.interaction_path`` / ``interaction_name``::

    def interaction(messages: list[dict], extra_info: dict) -> dict | None:
        # return the next user/tool message, e.g. {"role": "user", "content": "try again"},
        # or None to end the conversation

Everything the policy sees after the original prompt lands in ``responses``; ``response_mask``
is 1 only on tokens the policy generated, so the loss, the KL and the entropy ignore the
interaction's tokens while ``attention_mask`` keeps them as context (as in verl's multi-turn
rollout). The reward is still given per sample by the reward function, on the whole conversation.

Turns are batched: every live conversation generates its next assistant turn in one call of the
wrapped rollout, then the interaction answers each. An interaction message is tokenised as the
difference between the chat template's rendering of the conversation with and without it, so
its tokens are exactly what the template would have produced. A conversation ends when the
interaction returns None, the policy hits ``max_assistant_turns`` (or the interaction
``max_user_turns``), an assistant turn ends without EOS, or the response budget
(``data.max_response_length`` tokens in all) runs out.

Tools (``multi_turn.tool_config_path``, verl's tools YAML of built-in tools, ``engine.tools``):
an assistant turn holding hermes ``<tool_call>`` blocks is answered by the tools instead of the
interaction, one ``tool`` message per call (at most ``max_parallel_calls``), each cut to
``max_tool_response_length`` tokens at ``tool_response_truncate_side``, all rendered by the chat
template in one delta and masked out of the loss like the interaction's tokens. A tool turn
counts as a user turn (as in verl). A turn without a call goes to the interaction, or ends the
conversation when there is none. Non-tensor columns ``tool_call_counts`` and
``tool_error_counts`` count the calls per sample; ``turns`` lists each turn after the prompt
(assistant text, its calls, each tool answer and error) for the studio's inspector.
"""

from __future__ import annotations

import hashlib
import importlib.util
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from engine.data import DataProto
from engine.rollout.tool_calls import (
    TOOL_CALL_FORMATS,
    parse_hermes_tool_calls,
    run_tool_calls,
    truncate_tool_response,
)
from engine.tools.base import Tool, load_tools

Interaction = Callable[[list[dict[str, Any]], dict[str, Any]], dict[str, Any] | None]
_KEY = "actor_rollout_ref.rollout.multi_turn"


def load_interaction(path: str | Path, name: str) -> Interaction:
    """Return the function ``name`` defined in the Python file at ``path``."""
    file = Path(path).expanduser().resolve()
    if not file.is_file():
        raise FileNotFoundError(
            f"{_KEY}.interaction_path={str(path)!r} is not a file; point it at a Python file "
            "defining the interaction function"
        )
    module_name = "posttrain_interaction_" + hashlib.sha1(str(file).encode()).hexdigest()[:12]
    spec = importlib.util.spec_from_file_location(module_name, file)
    if spec is None or spec.loader is None:
        raise ImportError(f"{_KEY}.interaction_path={str(file)!r} cannot be loaded as Python")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        sys.modules.pop(module_name, None)
        raise ImportError(
            f"interaction file {file} failed to load: {type(exc).__name__}: {exc}"
        ) from exc
    fn = getattr(module, name, None)
    if not callable(fn):
        available = sorted(
            n for n, v in vars(module).items() if callable(v) and not n.startswith("_")
        )
        raise AttributeError(
            f"interaction file {file} has no function {name!r}; it defines "
            f"{available or 'no public functions'}. Set {_KEY}.interaction_name to one of them."
        )
    return fn


def message_delta_ids(
    tokenizer: Any,
    messages: list[dict],
    message: dict,
    chat_template_kwargs: dict[str, Any] | None = None,
) -> list[int]:
    """Return the token ids the chat template adds for ``message`` and the next assistant turn.

    That is ``render(messages + [message], add_generation_prompt=True)`` minus
    ``render(messages)``, tokenised without special tokens added; both renderings get
    ``chat_template_kwargs`` (``data.apply_chat_template_kwargs``), as the prompt's did.
    """
    kwargs = dict(chat_template_kwargs or {})
    before = tokenizer.apply_chat_template(messages, tokenize=False, **kwargs)
    after = tokenizer.apply_chat_template(
        [*messages, message], add_generation_prompt=True, tokenize=False, **kwargs
    )
    if not after.startswith(before):
        raise ValueError(
            "the chat template renders the conversation differently once a message is added, "
            "so the interaction's tokens cannot be appended; use a template whose rendering of "
            "a conversation is a prefix of its rendering with one more message"
        )
    return tokenizer(after[len(before) :], add_special_tokens=False)["input_ids"]


def messages_delta_ids(
    tokenizer: Any,
    messages: list[dict],
    new_messages: list[dict],
    chat_template_kwargs: dict[str, Any] | None = None,
) -> list[int]:
    """Return the token ids the chat template adds for ``new_messages`` and the next turn."""
    kwargs = dict(chat_template_kwargs or {})
    before = tokenizer.apply_chat_template(messages, tokenize=False, **kwargs)
    after = tokenizer.apply_chat_template(
        [*messages, *new_messages], add_generation_prompt=True, tokenize=False, **kwargs
    )
    if not after.startswith(before):
        raise ValueError(
            "the chat template renders the conversation differently once tool messages are "
            "added, so their tokens cannot be appended; use a template whose rendering of a "
            "conversation is a prefix of its rendering with more messages"
        )
    return tokenizer(after[len(before) :], add_special_tokens=False)["input_ids"]


@dataclass
class _Conversation:
    """One sample's growing conversation: context ids and the response columns built so far."""

    context: list[int]
    messages: list[dict[str, Any]]
    extra_info: dict[str, Any]
    tokens: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    assistant_turns: int = 0
    user_turns: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    turns: list[dict[str, Any]] = field(default_factory=list)
    truncated: bool = False
    done: bool = False

    def append(self, ids: list[int], logp: list[float] | None, budget: int) -> bool:
        """Append ``ids`` (assistant tokens when ``logp`` is given); return True if all fit."""
        kept = ids[: budget - len(self.tokens)]
        self.tokens += kept
        self.context += kept
        self.mask += [1 if logp is not None else 0] * len(kept)
        self.log_probs += list(logp[: len(kept)]) if logp is not None else [0.0] * len(kept)
        return len(kept) == len(ids)


def _row_extra_info(non_tensor: dict[str, Any], i: int) -> dict[str, Any]:
    """Return a copy of the row's ``extra_info`` plus its ground truth and data source."""
    info = non_tensor.get("extra_info")
    extra = dict(info[i]) if info is not None and isinstance(info[i], dict) else {}
    reward_model = non_tensor.get("reward_model")
    if reward_model is not None and isinstance(reward_model[i], dict):
        extra.setdefault("ground_truth", reward_model[i].get("ground_truth"))
    if "data_source" in non_tensor:
        extra.setdefault("data_source", non_tensor["data_source"][i])
    return extra


def _left_pad(rows: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Return ``input_ids`` and ``attention_mask`` (bs, max_len), padded on the left."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        if row:
            ids[i, width - len(row) :] = torch.tensor(row, dtype=torch.long)
            mask[i, width - len(row) :] = 1
    return ids, mask


class MultiTurnRollout:
    """Alternate assistant turns (the wrapped rollout) with interaction turns."""

    def __init__(
        self,
        rollout: Any,
        tokenizer: Any,
        multi_turn_config: Any,
        *,
        interaction: Interaction | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
        tools: dict[str, Tool] | None = None,
    ) -> None:
        """Wrap ``rollout``; ``interaction`` and ``tools`` default to the ones the config names.

        ``chat_template_kwargs`` (``data.apply_chat_template_kwargs``) go to the chat template
        whenever a turn is rendered. With tools, the interaction is optional.
        """
        self.rollout = rollout
        self.tokenizer = tokenizer
        self.config = multi_turn_config
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        tool_path = getattr(multi_turn_config, "tool_config_path", None)
        if tools is None and tool_path:
            tools = load_tools(tool_path)
        self.tools = tools or {}
        if self.tools and getattr(multi_turn_config, "format", "hermes") not in TOOL_CALL_FORMATS:
            raise ValueError(
                f"{_KEY}.format={multi_turn_config.format!r} is not supported; use "
                f"{' or '.join(TOOL_CALL_FORMATS)}"
            )
        has_interaction = multi_turn_config.interaction_path or multi_turn_config.interaction_name
        if interaction is None and (has_interaction or not self.tools):
            path, name = multi_turn_config.interaction_path, multi_turn_config.interaction_name
            if not path or not name:
                raise ValueError(
                    f"{_KEY}.enable=True needs {_KEY}.interaction_path (a Python file) and "
                    f"{_KEY}.interaction_name (the function in it), or {_KEY}.tool_config_path"
                )
            interaction = load_interaction(path, name)
        self.interaction = interaction
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0

    def load_weights(self, weights: Any) -> Any:
        """Forward the new policy weights to the wrapped rollout."""
        return self.rollout.load_weights(weights)

    def _start(self, prompts: DataProto) -> list[_Conversation]:
        non_tensor = prompts.non_tensor_batch
        if "raw_prompt" not in non_tensor:
            raise KeyError(
                "multi-turn rollout needs each prompt's chat messages in the non-tensor column "
                "'raw_prompt' (RLHFDataset provides it); or set "
                f"{_KEY}.enable=False"
            )
        ids = prompts.batch["input_ids"].cpu()
        mask = prompts.batch["attention_mask"].cpu()
        return [
            _Conversation(
                context=ids[i][mask[i].bool()].tolist(),
                messages=[dict(m) for m in non_tensor["raw_prompt"][i]],
                extra_info=_row_extra_info(non_tensor, i),
            )
            for i in range(len(prompts))
        ]

    def _assistant_turn(
        self, live: list[_Conversation], budget: int, sampling: dict, generator: Any, device: Any
    ) -> None:
        ids, mask = _left_pad([c.context for c in live], self.pad_id)
        position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
        batch = DataProto.from_dict(
            {"input_ids": ids, "attention_mask": mask, "position_ids": position_ids}
        ).to(device)
        room = max(budget - len(c.tokens) for c in live)
        out = self.rollout.generate_sequences(
            batch, max_new_tokens=room, sampling=sampling, generator=generator
        )
        responses = out.batch["responses"].cpu()
        response_mask = out.batch["response_mask"].cpu().bool()
        log_probs = out.batch["rollout_log_probs"].cpu()
        truncated = out.non_tensor_batch["truncated"]
        for i, conv in enumerate(live):
            tokens = responses[i][response_mask[i]].tolist()
            fits = conv.append(tokens, log_probs[i][response_mask[i]].tolist(), budget)
            conv.assistant_turns += 1
            text = self.tokenizer.decode(tokens, skip_special_tokens=True)
            conv.messages.append({"role": "assistant", "content": text})
            conv.turns.append({"role": "assistant", "content": text})
            limit = self.config.max_assistant_turns
            if bool(truncated[i]) or not fits:
                conv.truncated, conv.done = True, True
            elif len(conv.tokens) >= budget or (limit and conv.assistant_turns >= limit):
                conv.done = True

    def _tool_turn(self, conv: _Conversation, calls: list[Any], budget: int) -> None:
        """Run the last assistant turn's calls and append their answers as ``tool`` messages."""
        if self.config.max_user_turns and conv.user_turns >= self.config.max_user_turns:
            conv.done = True
            return
        parallel = int(getattr(self.config, "max_parallel_calls", 1))
        results = run_tool_calls(calls, self.tools, conv.extra_info, max_parallel_calls=parallel)
        limit = int(getattr(self.config, "max_tool_response_length", 256))
        side = getattr(self.config, "tool_response_truncate_side", "middle")
        for result in results:
            result.content = truncate_tool_response(result.content, self.tokenizer, limit, side)
        new = [{"role": "tool", "content": r.content} for r in results]
        delta = messages_delta_ids(self.tokenizer, conv.messages, new, self.chat_template_kwargs)
        conv.messages += new
        conv.turns[-1]["tool_calls"] = [{"name": r.name, "arguments": r.arguments} for r in results]
        conv.turns += [{"role": "tool", **r.to_dict()} for r in results]
        conv.tool_calls += len(results)
        conv.tool_errors += sum(r.error is not None for r in results)
        conv.user_turns += 1
        if not conv.append(delta, None, budget) or len(conv.tokens) >= budget:
            conv.truncated, conv.done = True, True  # no room left for the policy to answer

    def _next_turn(self, conv: _Conversation, budget: int) -> None:
        """Answer the last assistant turn with its tool calls, the interaction, or stop."""
        text = conv.messages[-1]["content"]
        calls = parse_hermes_tool_calls(text) if self.tools else []
        if calls:
            self._tool_turn(conv, calls, budget)
        elif self.interaction is not None:
            self._interaction_turn(conv, budget)
        else:
            conv.done = True

    def _interaction_turn(self, conv: _Conversation, budget: int) -> None:
        if self.config.max_user_turns and conv.user_turns >= self.config.max_user_turns:
            conv.done = True
            return
        assert self.interaction is not None
        message = self.interaction(conv.messages, conv.extra_info)
        if message is None:
            conv.done = True
            return
        if not isinstance(message, dict) or "role" not in message or "content" not in message:
            raise TypeError(
                f"the interaction must return a message dict with 'role' and 'content' or None, "
                f"got {message!r}"
            )
        delta = message_delta_ids(self.tokenizer, conv.messages, message, self.chat_template_kwargs)
        conv.messages.append(dict(message))
        conv.turns.append(dict(message))
        conv.user_turns += 1
        if not conv.append(delta, None, budget) or len(conv.tokens) >= budget:
            conv.truncated, conv.done = True, True  # no room left for the policy to answer

    def generate_sequences(
        self,
        prompts: DataProto,
        *,
        max_new_tokens: int,
        sampling: dict[str, Any],
        generator: torch.Generator | None = None,
    ) -> DataProto:
        """Return the conversations' response tensors, as the single-turn rollouts do.

        ``responses`` (bs, T) holds every token after the prompt; ``response_mask`` (bs, T) is 1
        on assistant tokens only; ``attention_mask`` (bs, P + T) is 1 on all of them;
        ``rollout_log_probs`` (bs, T) is 0 on interaction tokens. Non-tensor columns:
        ``messages`` (the whole conversation), ``truncated``, ``num_turns`` (assistant turns),
        ``tool_call_counts``, ``tool_error_counts`` and ``turns`` (see the module docstring).
        """
        prompt_ids = prompts.batch["input_ids"]  # (bs, P)
        prompt_mask = prompts.batch["attention_mask"]  # (bs, P)
        conversations = self._start(prompts)
        while live := [c for c in conversations if not c.done]:
            self._assistant_turn(live, max_new_tokens, sampling, generator, prompt_ids.device)
            for conv in live:
                if not conv.done:
                    self._next_turn(conv, max_new_tokens)

        width = max([len(c.tokens) for c in conversations] + [1])
        bs = len(conversations)
        responses = torch.full((bs, width), self.pad_id, dtype=torch.long)  # (bs, T)
        response_mask = torch.zeros((bs, width), dtype=torch.long)  # (bs, T)
        valid = torch.zeros((bs, width), dtype=torch.long)  # (bs, T): any real token
        log_probs = torch.zeros((bs, width), dtype=torch.float32)  # (bs, T)
        for i, conv in enumerate(conversations):
            n = len(conv.tokens)
            responses[i, :n] = torch.tensor(conv.tokens, dtype=torch.long)
            response_mask[i, :n] = torch.tensor(conv.mask, dtype=torch.long)
            valid[i, :n] = 1
            log_probs[i, :n] = torch.tensor(conv.log_probs, dtype=torch.float32)
        device = prompt_ids.device
        attention_mask = torch.cat([prompt_mask, valid.to(device)], dim=-1)  # (bs, P + T)
        responses = responses.to(device)
        tensors = {
            "prompts": prompt_ids,
            "responses": responses,
            "response_mask": response_mask.to(device),
            "input_ids": torch.cat([prompt_ids, responses], dim=-1),
            "attention_mask": attention_mask,
            "position_ids": (attention_mask.cumsum(-1) - 1).clamp(min=0),
            "rollout_log_probs": log_probs.to(device),
        }
        non_tensors = {
            "messages": [c.messages for c in conversations],
            "truncated": torch.tensor([c.truncated for c in conversations]).numpy(),
            "num_turns": [c.assistant_turns for c in conversations],
            "tool_call_counts": [c.tool_calls for c in conversations],
            "tool_error_counts": [c.tool_errors for c in conversations],
            "turns": [c.turns for c in conversations],
        }
        return DataProto.from_dict(tensors, non_tensors)
