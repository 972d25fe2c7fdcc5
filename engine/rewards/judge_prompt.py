"""A judge's prompt template and score parser: data, checked before a run starts.

A generative reward model (an LLM judge, verl's GenRM) reads each response through a prompt
template and its reply is turned into a score by a parser. verl leaves both to a custom reward
function (``docs/advance/reward_loop.rst``); here they are settings, so a judge prompt is data
and never code:

- the template is ``str.format`` text whose only fields are :data:`JUDGE_FIELDS`, each a plain
  name (no attribute or index access, no conversion or format spec, which would reach into
  Python objects); a literal brace is written twice (``{{``, ``}}``);
- the parser is one of :data:`JUDGE_PARSERS`: ``number`` (the last number in the reply),
  ``verdict`` (the last verdict word in the reply, scored by a mapping such as yes→1, no→0) or
  ``boxed`` (the last ``\\boxed{}`` value: a number, or a verdict word when a mapping is given).

A reply with nothing to parse raises :class:`JudgeParseError`, which the reward manager records
as the sample's reward error; it never scores a silent 0. Torch-free, so the config validator
builds the parser and reads the template before anything is loaded.
"""

from __future__ import annotations

import math
import re
import string
from collections.abc import Callable, Mapping

JUDGE_FIELDS = ("prompt", "response", "ground_truth", "data_source")
JUDGE_PARSERS = ("number", "verdict", "boxed")
DEFAULT_VERDICTS = {"yes": 1.0, "no": 0.0}

_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")
_FIELD_LIST = ", ".join("{" + name + "}" for name in JUDGE_FIELDS)


class JudgeParseError(ValueError):
    """The judge's reply holds no score the parser can read."""


def template_problem(template: str) -> str | None:
    """Return what is wrong with a judge prompt template, or None when it can be rendered."""
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as exc:
        return (
            f"cannot be read as a template ({exc}); write a field as {{response}} and a literal "
            "brace twice ({{ or }})"
        )
    names = set()
    for _, name, spec, conversion in parsed:
        if name is None:
            continue
        if name not in JUDGE_FIELDS:
            return (
                f"has the unknown field {{{name}}}; the fields are {_FIELD_LIST}, and a literal "
                "brace is written twice ({{ or }})"
            )
        if spec or conversion:
            return (
                f"formats the field {{{name}}} ({'!' + conversion if conversion else ''}"
                f"{':' + spec if spec else ''}); write the plain field {{{name}}}"
            )
        names.add(name)
    if "response" not in names:
        return "never shows the judge the response; add the field {response}"
    return None


def render_template(template: str, fields: Mapping[str, object]) -> str:
    """Return ``template`` with each of :data:`JUDGE_FIELDS` replaced by ``str(fields[name])``
    (an absent or None field renders as the empty string)."""
    values = {name: "" if fields.get(name) is None else str(fields[name]) for name in JUDGE_FIELDS}
    return template.format_map(values)


def verdicts_problem(verdicts: Mapping[str, object]) -> str | None:
    """Return what is wrong with a verdict mapping (word to score), or None."""
    if not verdicts:
        return "is empty; map each verdict word to its score, e.g. {yes: 1.0, no: 0.0}"
    for word, value in verdicts.items():
        if not isinstance(word, str) or not word.strip() or word != word.strip():
            return f"has the word {word!r}; a verdict is a word without surrounding spaces"
        if isinstance(value, bool) or not isinstance(value, int | float):
            return f"maps {word!r} to {value!r}; a verdict's score is a number"
        if not math.isfinite(value):
            return f"maps {word!r} to {value!r}; a verdict's score is a finite number"
    lowered = [word.lower() for word in verdicts]
    if len(set(lowered)) != len(lowered):
        return "has two words that differ only in case; verdicts are matched ignoring case"
    return None


def _last_boxed(text: str) -> str | None:
    """Return the content of the last ``\\boxed{...}`` in ``text`` (nested braces kept)."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, i = 0, start + len("\\boxed")
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i + 1 : j]
    return None


def _number(text: str) -> float:
    matches = _NUMBER.findall(text)
    if not matches:
        raise JudgeParseError("no number in the judge's reply")
    value = float(matches[-1])
    if not math.isfinite(value):
        raise JudgeParseError(f"the judge's number {matches[-1]} is not finite")
    return value


def build_parser(kind: str, verdicts: Mapping[str, float] | None = None) -> Callable[[str], float]:
    """Return the parser ``kind`` (one of :data:`JUDGE_PARSERS`): reply text to score.

    Raise ValueError when it cannot be built (an unknown kind, a bad verdict mapping); the
    parser raises :class:`JudgeParseError` on a reply with no score in it.
    """
    if kind not in JUDGE_PARSERS:
        raise ValueError(f"unknown judge parser {kind!r}; choose one of {', '.join(JUDGE_PARSERS)}")
    mapping = dict(DEFAULT_VERDICTS if verdicts is None else verdicts)
    if kind == "verdict" or (kind == "boxed" and verdicts):
        problem = verdicts_problem(mapping)
        if problem is not None:
            raise ValueError(f"the verdict mapping {problem}")
    scores = {word.lower(): float(value) for word, value in mapping.items()}
    words = re.compile(
        r"(?<!\w)("
        + "|".join(re.escape(w) for w in sorted(scores, key=len, reverse=True))
        + r")(?!\w)",
        re.IGNORECASE,
    )

    def parse_number(text: str) -> float:
        return _number(text)

    def parse_verdict(text: str) -> float:
        found = words.findall(text)
        if not found:
            raise JudgeParseError(
                f"none of the verdict words ({', '.join(scores)}) in the judge's reply"
            )
        return scores[found[-1].lower()]

    def parse_boxed(text: str) -> float:
        content = _last_boxed(text)
        if content is None:
            raise JudgeParseError("no \\boxed{} value in the judge's reply")
        content = content.strip()
        if verdicts and content.lower() in scores:
            return scores[content.lower()]
        if not _NUMBER.fullmatch(content):
            raise JudgeParseError(f"the judge's \\boxed{{{content}}} is not a number")
        return _number(content)

    return {"number": parse_number, "verdict": parse_verdict, "boxed": parse_boxed}[kind]
