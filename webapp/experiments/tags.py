"""Tags of experiments and runs: stripped, lower-cased, de-duplicated, and refused by name when
the database cannot hold them."""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence

from engine.config import ConfigFieldError, ConfigValidationError
from webapp.experiments.models import Experiment

# Tags are one text column per tag (``Experiment.tags`` and ``Run.tags``, varchar(50)):
# PostgreSQL would refuse a longer one with a server error, so the limit is checked here.
TAG_MAX_CHARS: int = Experiment._meta.get_field("tags").base_field.max_length  # type: ignore
TAGS_MAX = 20
# Characters a tag may not hold: control and format characters (tabs, newlines, NUL, zero-width
# and bidi marks), line and paragraph separators, and unpaired surrogates (which UTF-8 cannot
# store). They would hide in the tag lists or break the comma-separated tags field.
_UNPRINTABLE = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})


class TagsInvalid(ConfigValidationError):
    """Tags that cannot be stored; each error is under the key ``tags`` and says the fix."""


def _shown(tag: str) -> str:
    return repr(tag if len(tag) <= 24 else tag[:20] + "…")


def _tag_problem(tag: str, position: int, count: int, *, from_text: bool) -> str | None:
    """Return what is wrong with the stripped, lower-cased ``tag`` (None: nothing)."""
    if not tag:
        fix = "remove the extra comma" if from_text else "remove the empty item"
        return f"tag {position} of {count} is empty; {fix}"
    for char in tag:
        if unicodedata.category(char) in _UNPRINTABLE:
            return (
                f"tag {_shown(tag)} holds the invisible or control character U+{ord(char):04X}; "
                "type the tag again without it"
            )
    if "," in tag:  # only from a list: text is split on commas
        return f"tag {_shown(tag)} holds a comma, which separates tags; send it as two items"
    if len(tag) > TAG_MAX_CHARS:
        return (
            f"tag {_shown(tag)} is over {TAG_MAX_CHARS} characters ({len(tag)}); "
            f"shorten it to {TAG_MAX_CHARS} or fewer"
        )
    return None


def clean_tags(tags: Sequence[str] | str) -> list[str]:
    """Return tags stripped, lower-cased and de-duplicated; a string is split on commas.

    Blank text is no tags. Raise ``TagsInvalid`` naming each tag that cannot be stored: an
    empty one (``a,,b``), one with a control character, one over ``TAG_MAX_CHARS`` characters,
    or more than ``TAGS_MAX`` tags in all.
    """
    from_text = isinstance(tags, str)
    items = list(tags) if not isinstance(tags, str) else tags.split(",") if tags.strip() else []
    cleaned = [t.strip().lower() for t in items]
    errors = [
        ConfigFieldError("tags", tag, problem)
        for position, tag in enumerate(cleaned, start=1)
        if (problem := _tag_problem(tag, position, len(cleaned), from_text=from_text))
    ][:5]  # the first few: a list of thousands of bad tags needs no thousand messages
    unique = list(dict.fromkeys(cleaned))
    if len(unique) > TAGS_MAX:
        errors.append(
            ConfigFieldError(
                "tags",
                unique,
                f"{len(unique)} tags given, {TAGS_MAX} at most; "
                f"remove {len(unique) - TAGS_MAX} of them",
            )
        )
    if errors:
        raise TagsInvalid(errors)
    return unique
