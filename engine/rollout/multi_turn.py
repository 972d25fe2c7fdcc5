"""Multi-turn rollout: the policy, its tools and an interaction take turns until one stops.

``actor_rollout_ref.rollout.multi_turn.enable`` wraps the single-turn rollout (``hf``, ``vllm``
or ``sglang``) in :class:`MultiTurnRollout`. What answers an assistant turn without a tool call
is an interaction (``engine.rollout.interactions``): verl's interaction classes listed in
``multi_turn.interaction_config_path``, picked per sample by ``extra_info.interaction_kwargs.name``,
or a plain function ``interaction(messages, extra_info) -> message | None`` named by
``interaction_path`` / ``interaction_name``.

Everything the policy sees after the original prompt lands in ``responses``; ``response_mask``
is 1 only on tokens the policy generated, so the loss, the KL and the entropy ignore the
interaction's tokens while ``attention_mask`` keeps them as context (as in verl's multi-turn
rollout). The reward is still given per sample by the reward function, on the whole conversation;
an interaction's turn scores reach it as ``extra_info["turn_scores"]`` (as verl's reward loop
passes them).

Turns are batched: every live conversation generates its next assistant turn in one call of the
wrapped rollout, then the interactions answer all of them at once. An interaction message is
tokenised as the difference between the chat template's rendering of the conversation with and
without it, so its tokens are exactly what the template would have produced. A conversation ends
when the interaction says so (None, or verl's ``should_terminate``) or fails (a recorded
interaction error), the policy hits ``max_assistant_turns`` (or the interaction
``max_user_turns``), an assistant turn ends without EOS, or the response budget
(``data.max_response_length`` tokens in all) runs out.

Tools (``multi_turn.tool_config_path``, verl's tools YAML of built-in tools, ``engine.tools``):
an assistant turn holding hermes ``<tool_call>`` blocks is answered by the tools instead of the
interaction, one ``tool`` message per call (at most ``max_parallel_calls``), each cut to
``max_tool_response_length`` tokens at ``tool_response_truncate_side``, all rendered by the chat
template in one delta and masked out of the loss like the interaction's tokens. A tool turn
counts as a user turn (as in verl). A turn without a call goes to the interaction, or ends the
conversation when there is none.

verl's two tokenisation keys:

- ``use_inference_chat_template``: False (default) continues each turn from the recorded token
  ids, the policy's full output included; True builds each later turn's prompt as a chat server
  would, by rendering the messages with the chat template (a template that drops earlier turns'
  reasoning then drops it). The training sequence stays the recorded ids either way, so with True
  the rollout's log-probs were taken in another context than the one the actor trains on.
- ``tokenization_sanity_check_mode``: at the end of each rollout, every conversation that was not
  cut short is tokenised again in one piece from its messages and compared with the ids built turn
  by turn: ``strict`` warns on any difference, ``ignore_strippable`` only when the texts differ by
  more than whitespace (a template's newline after the end-of-turn token, which the policy never
  generates), ``disable`` skips the check. One warning per rollout, as verl logs them.

Non-tensor columns: ``messages`` (the conversation), ``truncated``, ``num_turns`` (assistant
turns), ``tool_call_counts`` and ``tool_error_counts`` per sample, ``turn_scores`` (the
interaction's scores, one per scored turn), ``interaction_errors`` (what failed) and ``turns``
(each turn after the prompt: assistant text and its calls, each tool answer and error, each
interaction message with its score) for the studio's inspector.
"""

from __future__ import annotations

import difflib
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from engine.data import DataProto
from engine.rollout.interactions import (
    Interaction,
    Interactions,
    Session,
    load_interaction,
)
from engine.rollout.names import SANITY_CHECK_MODES, TOOL_CALL_FORMATS
from engine.rollout.tool_calls import (
    parse_hermes_tool_calls,
    run_tool_calls,
    truncate_tool_response,
)
from engine.tools.base import Tool
from engine.tools.loader import load_tools

if TYPE_CHECKING:
    from engine.config.rollout import MultiTurnConfig

__all__ = ["MultiTurnRollout", "load_interaction", "message_delta_ids", "messages_delta_ids"]

logger = logging.getLogger(__name__)
_KEY = "actor_rollout_ref.rollout.multi_turn"


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
    session: Session | None = None
    tokens: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    assistant_turns: int = 0
    user_turns: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    turn_scores: list[float] = field(default_factory=list)
    interaction_errors: list[str] = field(default_factory=list)
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


def text_differences(full: str, incremental: str) -> list[tuple[str, str]]:
    """Return the ``(full, incremental)`` pieces of text where the two renderings differ."""
    matcher = difflib.SequenceMatcher(None, full, incremental, autojunk=False)
    return [
        (full[i1:i2], incremental[j1:j2])
        for tag, i1, i2, j1, j2 in matcher.get_opcodes()
        if tag != "equal"
    ]


def _build_interactions(
    config: MultiTurnConfig, interaction: Interaction | None, has_tools: bool
) -> Interactions | None:
    """Return the interactions ``config`` names (or ``interaction``), None for none."""
    if interaction is not None:
        return Interactions.from_function(interaction)
    yaml_path = getattr(config, "interaction_config_path", None)
    path, name = config.interaction_path, config.interaction_name
    if yaml_path:
        if path or name:
            raise ValueError(
                f"{_KEY}.interaction_config_path (verl's interaction YAML) and "
                f"{_KEY}.interaction_path / interaction_name (a function) are both set; keep one"
            )
        return Interactions.from_yaml(yaml_path)
    if not path and not name and has_tools:
        return None
    if not path or not name:
        raise ValueError(
            f"{_KEY}.enable=True needs {_KEY}.interaction_config_path (verl's interaction YAML), "
            f"or {_KEY}.interaction_path (a Python file) and {_KEY}.interaction_name (the "
            f"function in it), or {_KEY}.tool_config_path"
        )
    return Interactions.from_function(load_interaction(path, name))


class MultiTurnRollout:
    """Alternate assistant turns (the wrapped rollout) with tool and interaction turns."""

    def __init__(
        self,
        rollout: Any,
        tokenizer: Any,
        multi_turn_config: MultiTurnConfig,
        *,
        interaction: Interaction | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
        tools: dict[str, Tool] | None = None,
    ) -> None:
        """Wrap ``rollout``; ``interaction`` (a plain function) and ``tools`` default to the
        ones the config names.

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
        self.sanity_check_mode = getattr(
            multi_turn_config, "tokenization_sanity_check_mode", "strict"
        )
        if self.sanity_check_mode not in SANITY_CHECK_MODES:
            raise ValueError(
                f"{_KEY}.tokenization_sanity_check_mode={self.sanity_check_mode!r}; use one of "
                f"{', '.join(SANITY_CHECK_MODES)}"
            )
        self.inference_chat_template = bool(
            getattr(multi_turn_config, "use_inference_chat_template", False)
        )
        self.interactions = _build_interactions(multi_turn_config, interaction, bool(self.tools))
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0

    def load_weights(self, weights: Any) -> Any:
        """Forward the new policy weights to the wrapped rollout."""
        return self.rollout.load_weights(weights)

    def _render(self, messages: list[dict[str, Any]], generation_prompt: bool) -> list[int]:
        """Return the chat template's token ids of ``messages`` in one piece."""
        text = self.tokenizer.apply_chat_template(
            messages,
            add_generation_prompt=generation_prompt,
            tokenize=False,
            **self.chat_template_kwargs,
        )
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

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
        conversations = [
            _Conversation(
                context=ids[i][mask[i].bool()].tolist(),
                messages=[dict(m) for m in non_tensor["raw_prompt"][i]],
                extra_info=_row_extra_info(non_tensor, i),
            )
            for i in range(len(prompts))
        ]
        if self.interactions is not None:
            for conv in conversations:  # every row's choice is checked before any starts
                conv.session = self.interactions.session(conv.extra_info)
            sessions = [c.session for c in conversations if c.session is not None]
            for conv, error in zip(conversations, self.interactions.start(sessions), strict=True):
                if error is not None:
                    conv.interaction_errors.append(error)
                    conv.session = None
        return conversations

    def _generation_context(self, conv: _Conversation) -> list[int]:
        """Return the ids the engine continues from (see ``use_inference_chat_template``)."""
        if not self.inference_chat_template or conv.assistant_turns == 0:
            return conv.context
        return self._render(conv.messages, generation_prompt=True)

    def _assistant_turn(
        self, live: list[_Conversation], budget: int, sampling: dict, generator: Any, device: Any
    ) -> None:
        ids, mask = _left_pad([self._generation_context(c) for c in live], self.pad_id)
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

    def _user_turns_left(self, conv: _Conversation) -> bool:
        """Return False (and end the conversation) once ``max_user_turns`` are used up."""
        if self.config.max_user_turns and conv.user_turns >= self.config.max_user_turns:
            conv.done = True
            return False
        return True

    def _tool_turn(self, conv: _Conversation, calls: list[Any], budget: int) -> None:
        """Run the last assistant turn's calls and append their answers as ``tool`` messages."""
        if not self._user_turns_left(conv):
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

    def _next_turns(self, live: list[_Conversation], budget: int) -> None:
        """Answer each last assistant turn with its tool calls, the interaction, or stop."""
        asking = []
        for conv in live:
            calls = parse_hermes_tool_calls(conv.messages[-1]["content"]) if self.tools else []
            if calls:
                self._tool_turn(conv, calls, budget)
            elif conv.session is None:
                conv.done = True
            elif self._user_turns_left(conv):
                asking.append(conv)
        if asking:
            self._interaction_turns(asking, budget)

    def _interaction_turns(self, convs: list[_Conversation], budget: int) -> None:
        """Ask the interactions about ``convs`` at once and append their messages."""
        assert self.interactions is not None
        sessions = [c.session for c in convs if c.session is not None]
        replies = self.interactions.respond(sessions, [c.messages for c in convs])
        for conv, reply in zip(convs, replies, strict=True):
            if reply.error is not None:
                conv.interaction_errors.append(reply.error)
                conv.turns.append({"role": "user", "content": "", "error": reply.error})
                conv.done = True
                continue
            if reply.score is not None:
                conv.turn_scores.append(reply.score)
            if reply.message is None:
                conv.done = True
                continue
            turn = dict(reply.message)
            if reply.score is not None:
                turn["score"] = reply.score
            if reply.ends:  # recorded for the inspector; the sequence ends on the assistant turn
                conv.turns.append({**turn, "ends": True})
                conv.done = True
                continue
            delta = message_delta_ids(
                self.tokenizer, conv.messages, reply.message, self.chat_template_kwargs
            )
            conv.messages.append(dict(reply.message))
            conv.turns.append(turn)
            conv.user_turns += 1
            if not conv.append(delta, None, budget) or len(conv.tokens) >= budget:
                conv.truncated, conv.done = True, True  # no room left for the policy to answer

    def _finish(self, conversations: list[_Conversation]) -> None:
        """Finalize every conversation's interaction (verl's ``finalize_interaction``)."""
        if self.interactions is None:
            return
        talking = [c for c in conversations if c.session is not None]
        errors = self.interactions.finish([c.session for c in talking if c.session is not None])
        for conv, error in zip(talking, errors, strict=True):
            if error is not None:
                conv.interaction_errors.append(error)

    def _check_tokenization(self, conversations: list[_Conversation]) -> None:
        """Warn when turn-by-turn ids differ from the messages tokenised in one piece."""
        if self.sanity_check_mode == "disable":
            return
        differing: list[tuple[int, str, str]] = []
        for i, conv in enumerate(conversations):
            if conv.truncated:  # the template would close the cut turn: never equal
                continue
            full = self._render(conv.messages, generation_prompt=False)
            if full == conv.context:
                continue
            texts = (
                self.tokenizer.decode(full, skip_special_tokens=False),
                self.tokenizer.decode(conv.context, skip_special_tokens=False),
            )
            # Equal once whitespace is dropped: the renderings differ by whitespace alone.
            strippable = "".join(texts[0].split()) == "".join(texts[1].split())
            if self.sanity_check_mode == "ignore_strippable" and strippable:
                continue
            differing.append((i, *texts))
        if differing:
            i, full_text, turn_text = differing[0]  # the diff is quadratic: of one sample only
            pieces = text_differences(full_text, turn_text)
            shown = "; ".join(f"full {a!r} vs turn by turn {b!r}" for a, b in pieces[:3])
            logger.warning(
                "%s.tokenization_sanity_check_mode=%s: %d of %d conversations' token ids differ "
                "from their messages tokenised in one piece (sample %d: %s), so the training "
                "sequence is not what the chat template gives; check the template, or set the "
                "mode to ignore_strippable (whitespace only) or disable",
                _KEY,
                self.sanity_check_mode,
                len(differing),
                len(conversations),
                i,
                shown or "same text, split into other tokens",
            )

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
        ``rollout_log_probs`` (bs, T) is 0 on interaction tokens. Non-tensor columns: see the
        module docstring.
        """
        prompt_ids = prompts.batch["input_ids"]  # (bs, P)
        prompt_mask = prompts.batch["attention_mask"]  # (bs, P)
        conversations = self._start(prompts)
        try:
            while live := [c for c in conversations if not c.done]:
                self._assistant_turn(live, max_new_tokens, sampling, generator, prompt_ids.device)
                self._next_turns([c for c in live if not c.done], max_new_tokens)
        finally:
            self._finish(conversations)
        self._check_tokenization(conversations)

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
            "turn_scores": [c.turn_scores for c in conversations],
            "interaction_errors": [c.interaction_errors for c in conversations],
            "turns": [c.turns for c in conversations],
        }
        return DataProto.from_dict(tensors, non_tensors)
