"""MATH reward (Hendrycks et al. 2021) with verl's ``\\boxed{}`` extraction and normalisation.

The answer is the content of the last ``\\boxed{...}`` (or ``\\fbox{...}``) in the response. Both
it and the ground truth go through ``strip_string``, the lm-evaluation-harness normalisation verl
uses: drop line breaks, ``\\!``, ``\\left``/``\\right``, degrees, ``\\$``, a trailing
``\\text{ unit}``, percent signs and spaces; ``tfrac``/``dfrac`` become ``frac``; a leading
``k =`` is removed; ``\\frac12`` becomes ``\\frac{1}{2}``, ``\\sqrt3`` becomes ``\\sqrt{3}``,
``.5`` becomes ``0.5``, the exact string ``0.5`` becomes ``\\frac{1}{2}`` and ``a/b`` of two
integers becomes ``\\frac{a}{b}``. Two answers are equivalent when the normalised strings are
equal. This is string matching, not symbolic equivalence: ``2/4`` and ``\\frac{1}{2}`` differ,
exactly as in verl, so scores stay comparable with verl's runs.

Reference: Hendrycks et al. "Measuring Mathematical Problem Solving With the MATH Dataset."
NeurIPS 2021.
"""

from __future__ import annotations


def compute_score(solution_str: str, ground_truth: str) -> float:
    """Return 1.0 when the last boxed answer is equivalent to the ground truth, else 0.0."""
    try:
        boxed = last_boxed_only_string(solution_str)
        if boxed is not None and is_equiv(remove_boxed(boxed), ground_truth):
            return 1.0
    except (AssertionError, IndexError, ValueError):
        # A malformed box scores 0, as in verl, instead of failing the sample.
        pass
    return 0.0


def is_equiv(str1: str | None, str2: str | None) -> bool:
    """Return whether two answers are equal after ``strip_string``."""
    if str1 is None and str2 is None:
        return True
    if str1 is None or str2 is None:
        return False
    try:
        return strip_string(str1) == strip_string(str2)
    except (AssertionError, IndexError, ValueError):
        return str1 == str2


def last_boxed_only_string(string: str) -> str | None:
    """Return the last ``\\boxed{...}`` (or ``\\fbox{...}``) with its braces balanced, or None."""
    idx = string.rfind("\\boxed")
    if idx < 0:
        idx = string.rfind("\\fbox")
        if idx < 0:
            return None
    depth = 0
    for i in range(idx, len(string)):
        if string[i] == "{":
            depth += 1
        elif string[i] == "}":
            depth -= 1
            if depth == 0:
                return string[idx : i + 1]
    return None


def remove_boxed(s: str) -> str:
    """Return the content of ``\\boxed{content}`` or ``\\boxed content``."""
    if "\\boxed " in s:
        left = "\\boxed "
        if not s.startswith(left):
            raise ValueError(f"expected {left!r} at the start of {s!r}")
        return s[len(left) :]
    left = "\\boxed{"
    if not (s.startswith(left) and s.endswith("}")):
        raise ValueError(f"expected {left!r}...'}}' around {s!r}")
    return s[len(left) : -1]


def _fix_fracs(string: str) -> str:
    """Brace the arguments of ``\\frac12`` and ``\\frac1{72}`` (not ``\\frac{72}1``)."""
    head, *rest = string.split("\\frac")
    out = head
    for substr in rest:
        out += "\\frac"
        if substr[0] == "{":  # an empty remainder raises, and is_equiv compares raw strings
            out += substr
            continue
        if len(substr) < 2:
            return string
        a, b, post = substr[0], substr[1], substr[2:]
        out += "{" + a + "}{" + b + "}" + post if b != "{" else "{" + a + "}" + b + post
    return out


def _fix_a_slash_b(string: str) -> str:
    """Rewrite ``a/b`` of two plain integers as ``\\frac{a}{b}``."""
    parts = string.split("/")
    if len(parts) != 2:
        return string
    try:
        a, b = int(parts[0]), int(parts[1])
    except ValueError:
        return string
    if string != f"{a}/{b}":
        return string
    return "\\frac{" + str(a) + "}{" + str(b) + "}"


def _remove_right_units(string: str) -> str:
    """Drop a trailing ``\\text{ unit}`` (in MATH it only ever describes units)."""
    if "\\text{ " in string:
        splits = string.split("\\text{ ")
        if len(splits) != 2:
            raise ValueError(f"more than one '\\text{{ ' in {string!r}")
        return splits[0]
    return string


def _fix_sqrt(string: str) -> str:
    """Brace a one-character ``\\sqrt`` argument: ``\\sqrt3`` -> ``\\sqrt{3}``."""
    head, *rest = string.split("\\sqrt")
    out = head
    for split in rest:
        if split[0] != "{":
            out += "\\sqrt{" + split[0] + "}" + split[1:]
        else:
            out += "\\sqrt" + split
    return out


def strip_string(string: str) -> str:
    """Return the MATH normal form of an answer (see the module docstring for the steps)."""
    string = string.replace("\n", "")
    string = string.replace("\\!", "")
    string = string.replace("\\\\", "\\")
    string = string.replace("tfrac", "frac").replace("dfrac", "frac")
    string = string.replace("\\left", "").replace("\\right", "")
    string = string.replace("^{\\circ}", "").replace("^\\circ", "")
    string = string.replace("\\$", "")
    string = _remove_right_units(string)
    string = string.replace("\\%", "")
    # " 0." is " ." and "{0." is "{."; a leading "." gets a "0".
    string = string.replace(" .", " 0.").replace("{.", "{0.")
    if not string:
        return string
    if string[0] == ".":
        string = "0" + string
    # "k = 5" -> "5" when the left side is at most two characters.
    if len(string.split("=")) == 2 and len(string.split("=")[0]) <= 2:
        string = string.split("=")[1]
    string = _fix_sqrt(string)
    string = string.replace(" ", "")
    string = _fix_fracs(string)
    if string == "0.5":
        string = "\\frac{1}{2}"
    return _fix_a_slash_b(string)
