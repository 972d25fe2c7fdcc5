"""Read the arguments a bash script hands one command, without running the script.

verl's example scripts are straight-line bash: variables with defaults (``${NAME:-value}``),
arithmetic (``$((1024 * 8))``), ``export``, a few ``if [ "$x" = vllm ]`` branches, arrays, line
continuations, comments between the continued lines, ``$@``. This module reads that subset the way
bash does (quoting, word splitting of unquoted expansions, a comment ending the command) and
returns the words of the first command that contains a given word, so a script's command line can
be checked without executing anything it calls. What it does not evaluate: ``$(...)`` other than
``pwd``, ``date``, ``basename`` and ``dirname`` stays as its own text; a ``for``/``while`` loop,
``case`` and a function body are skipped; an ``if`` whose test is not ``[ ]`` / ``[[ ]]`` counts as
true.
"""

from __future__ import annotations

import ast
import operator
import os
import re
from dataclasses import dataclass, field

NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
ASSIGNMENT = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)(\+?)=")
SEPARATORS = {"\n", ";", "&&", "||", "|", "&", ";;"}
REDIRECTIONS = re.compile(r"\d*(>>|>&|>|<<<|<<|<|&>)")
OPENERS = {"for": "done", "while": "done", "until": "done", "case": "esac", "select": "done"}
FIELD_BREAK = "\0"  # between the elements of "${NAME[@]}" (bash strings hold no NUL)
DATE = "20260101"  # what $(date ...) stands for: the extraction does not depend on the day


class ShellError(ValueError):
    """The script uses bash this reader does not follow."""


@dataclass
class Part:
    """One piece of a word: literal text, ``$name``/``${...}``, ``$(...)`` or ``$((...))``."""

    kind: str  # "text", "param", "command", "arith"
    text: str
    quoted: bool


@dataclass
class Word:
    parts: list[Part] = field(default_factory=list)
    array: list[Word] | None = None  # NAME=( ... ): the words between the brackets

    def literal(self) -> str | None:
        """Return the word's text when it is all unquoted literal text."""
        if all(p.kind == "text" and not p.quoted for p in self.parts):
            return "".join(p.text for p in self.parts)
        return None


Token = Word | str  # a word, or an operator ("\n", ";", "|", "(", ">", ...)


class _Lexer:
    def __init__(self, text: str):
        self.text, self.i = text, 0

    def peek(self, n: int = 1) -> str:
        return self.text[self.i : self.i + n]

    def tokens(self) -> list[Token]:
        out: list[Token] = []
        while self.i < len(self.text):
            c = self.text[self.i]
            if c in " \t":
                self.i += 1
            elif self.peek(2) == "\\\n":
                self.i += 2
            elif c == "#":
                while self.i < len(self.text) and self.text[self.i] != "\n":
                    self.i += 1
            elif c == "\n":
                out.append("\n")
                self.i += 1
            elif self.peek(2) in ("&&", "||", ";;"):
                out.append(self.peek(2))
                self.i += 2
            elif c in ";|&()":
                out.append(c)
                self.i += 1
            else:
                redirect = REDIRECTIONS.match(self.text, self.i)
                if redirect:
                    out.append(redirect.group(0))
                    self.i = redirect.end()
                    continue
                word = self.word()
                out.append(word)
                literal = "".join(p.text for p in word.parts)
                if ASSIGNMENT.fullmatch(literal) and self.peek() == "(":
                    self.i += 1
                    word.array = self.array()
        return out

    def array(self) -> list[Word]:
        words: list[Word] = []
        while True:
            while self.i < len(self.text) and self.text[self.i] in " \t\n":
                self.i += 1
            if self.peek(2) == "\\\n":
                self.i += 2
            elif self.peek() == "#":
                while self.i < len(self.text) and self.text[self.i] != "\n":
                    self.i += 1
            elif self.peek() == ")":
                self.i += 1
                return words
            elif not self.peek():
                raise ShellError("an array is not closed with )")
            else:
                words.append(self.word())

    def word(self) -> Word:
        parts: list[Part] = []
        while self.i < len(self.text):
            c = self.text[self.i]
            if c in " \t\n;|&()<>":
                break
            if self.peek(2) == "\\\n":
                self.i += 2
            elif c == "\\":
                parts.append(Part("text", self.text[self.i + 1 : self.i + 2], True))
                self.i += 2
            elif c == "'":
                end = self.text.find("'", self.i + 1)
                if end < 0:
                    raise ShellError("a single quote is not closed")
                parts.append(Part("text", self.text[self.i + 1 : end], True))
                self.i = end + 1
            elif c == '"':
                self.i += 1
                parts += self.double_quoted()
            elif c == "$" or c == "`":
                parts.append(self.dollar(quoted=False))
            else:
                start = self.i
                while self.i < len(self.text) and self.text[self.i] not in " \t\n;|&()<>\\'\"$`":
                    self.i += 1
                parts.append(Part("text", self.text[start : self.i], False))
        return Word(parts)

    def double_quoted(self) -> list[Part]:
        parts: list[Part] = []
        text = ""
        empty = True
        while True:
            if self.i >= len(self.text):
                raise ShellError("a double quote is not closed")
            c = self.text[self.i]
            if c == '"':
                self.i += 1
                break
            if c == "\\" and self.peek(2)[1:] in ('"', "\\", "$", "`", "\n"):
                text += "" if self.peek(2) == "\\\n" else self.text[self.i + 1]
                self.i += 2
            elif c in "$`":
                if text:
                    parts.append(Part("text", text, True))
                text, empty = "", False
                parts.append(self.dollar(quoted=True))
            else:
                text += c
                self.i += 1
        if text or empty:  # "" is an (empty) argument of its own
            parts.append(Part("text", text, True))
        return parts

    def dollar(self, quoted: bool) -> Part:
        if self.peek() == "`":
            end = self.text.find("`", self.i + 1)
            if end < 0:
                raise ShellError("a backquote is not closed")
            inner, self.i = self.text[self.i + 1 : end], end + 1
            return Part("command", inner, quoted)
        if self.peek(3) == "$((":
            self.i += 3
            return Part("arith", self.closing("((", "))"), quoted)
        if self.peek(2) == "$(":
            self.i += 2
            return Part("command", self.closing("(", ")"), quoted)
        if self.peek(2) == "${":
            self.i += 2
            return Part("param", self.closing("{", "}"), quoted)
        self.i += 1
        name = NAME.match(self.text, self.i)
        if name:
            self.i = name.end()
            return Part("param", name.group(0), quoted)
        if self.peek() and self.peek() in "@*#?$!0123456789-":
            self.i += 1
            return Part("param", self.text[self.i - 1], quoted)
        return Part("text", "$", quoted)

    def closing(self, opening: str, closing: str) -> str:
        """Return the text up to the ``closing`` that balances ``opening`` (``$(``, ``$((``,
        ``${``, already read), skipping single-quoted text."""
        depth = initial = len(closing)
        start = self.i
        while self.i < len(self.text):
            c = self.text[self.i]
            if c == "\\":
                self.i += 2
                continue
            if c == "'":
                end = self.text.find("'", self.i + 1)
                if end < 0:
                    raise ShellError("a single quote is not closed")
                self.i = end + 1
                continue
            depth += (c == opening[0]) - (c == closing[0])
            self.i += 1
            if depth == 0:
                return self.text[start : self.i - initial]
        raise ShellError(f"{opening} is not closed with {closing}")


_BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}


def _arith(node: ast.AST) -> int:
    if isinstance(node, ast.Expression):
        return _arith(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_arith(node.operand)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
        left, right = _arith(node.left), _arith(node.right)
        return int(left / right)  # bash divides integers towards zero
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        return _BINARY[type(node.op)](_arith(node.left), _arith(node.right))
    raise ShellError(f"arithmetic this reader does not follow: {ast.dump(node)}")


class Shell:
    """The variables of a script read so far, ``env`` standing for the caller's environment.
    The script runs without arguments: ``$1``, ``$@`` and the like are empty."""

    def __init__(self, env: dict[str, str]):
        self.vars: dict[str, str | list[str]] = dict(env)

    # Expansion -------------------------------------------------------------------------------

    def value(self, name: str) -> str:
        if name == "#":
            return "0"
        found = self.vars.get(name, "")
        return found[0] if isinstance(found, list) and found else str(found or "")

    def param(self, text: str, quoted: bool) -> list[tuple[str, bool]]:
        """Expand ``${text}``; return (piece, may be split) pairs, one per array element."""
        if text.startswith("#"):
            return [(str(len(self.value(text[1:]))), False)]
        subscript = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_]*)\[([@*]|\d+)\]", text)
        if subscript:
            name, index = subscript.groups()
            found = self.vars.get(name, [])
            items = found if isinstance(found, list) else [found]
            if index == "@" and quoted:  # "${NAME[@]}": one argument per element
                return [p for item in items for p in ((FIELD_BREAK, False), (item, False))][1:]
            if index in "@*":
                return [(item, not quoted) for item in items]
            position = int(index)
            return [(items[position] if position < len(items) else "", not quoted)]
        if re.fullmatch(r"[@*](:\d+)?", text):  # "$@", "${@:2}": no arguments, no words
            return []
        match = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_]*|[0-9@*#])(:?[-=+?])?(.*)", text, re.S)
        if not match:
            raise ShellError(f"${{{text}}} is not an expansion this reader follows")
        name, op, word = match.groups()
        current = self.value(name)
        is_set = name in self.vars
        present = bool(current) if (op or "").startswith(":") else is_set
        if op and op.endswith(("-", "=")) and not present:
            current = self.expand_text(word)
            if op.endswith("="):
                self.vars[name] = current
        elif op and op.endswith("+"):
            current = self.expand_text(word) if present else ""
        elif op and op.endswith("?") and not present:
            raise ShellError(f"${{{text}}}: the script requires {name}")
        return [(current, not quoted)]

    def command(self, text: str) -> str:
        words = self.split(text.strip())
        if words == ["pwd"]:
            return self.value("PWD")
        if words[:1] == ["date"]:
            return DATE
        if words[:1] == ["basename"] and len(words) == 2:
            return os.path.basename(words[1].rstrip("/"))
        if words[:1] == ["dirname"] and len(words) == 2:
            return os.path.dirname(words[1].rstrip("/")) or "."
        return f"$({text})"  # not evaluated: its own text stands in the argument

    def arithmetic(self, text: str) -> str:
        def number(match: re.Match) -> str:
            return self.value(match.group(1) or match.group(2)).strip() or "0"

        names = r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?|\b([A-Za-z_][A-Za-z0-9_]*)\b"
        try:
            tree = ast.parse(re.sub(names, number, text).strip(), mode="eval")
        except SyntaxError as exc:
            raise ShellError(f"$(({text})) is not arithmetic this reader follows") from exc
        try:
            return str(_arith(tree))
        except ZeroDivisionError as exc:
            raise ShellError(f"$(({text})) divides by zero") from exc

    def pieces(self, word: Word) -> list[tuple[str, bool]]:
        out: list[tuple[str, bool]] = []
        for part in word.parts:
            if part.kind == "text":
                out.append((part.text, False))
            elif part.kind == "param":
                out += self.param(part.text, part.quoted)
            elif part.kind == "command":
                out.append((self.command(part.text), not part.quoted))
            else:
                out.append((self.arithmetic(part.text), not part.quoted))
        return out

    def joined(self, word: Word) -> str:
        """Expand ``word`` as one string, as on the right of ``NAME=`` (no splitting)."""
        return "".join(" " if t == FIELD_BREAK else t for t, _ in self.pieces(word))

    def fields(self, word: Word) -> list[str]:
        """Expand ``word`` into the arguments bash makes of it (split where unquoted)."""
        fields: list[str] = []
        current: str | None = None
        quoted_empty = any(p.quoted and p.kind == "text" for p in word.parts)
        for text, splittable in self.pieces(word):
            if text == FIELD_BREAK:
                fields.append(current or "")
                current = None
                continue
            if not splittable:
                current = (current or "") + text
                continue
            chunks = re.split(r"[ \t\n]+", text)
            for n, chunk in enumerate(chunks):
                if n > 0:
                    if current:
                        fields.append(current)
                    current = None
                if chunk:
                    current = (current or "") + chunk
        if current is not None and (current or quoted_empty):
            fields.append(current)
        return fields

    def expand_text(self, text: str) -> str:
        """Expand ``text`` as the word of ``${name:-word}`` (no splitting)."""
        lexer = _Lexer(text)
        parts: list[Part] = []
        while lexer.i < len(text):
            c = text[lexer.i]
            if c == '"':
                lexer.i += 1
                parts += lexer.double_quoted()
            elif c == "'":
                end = text.index("'", lexer.i + 1)
                parts.append(Part("text", text[lexer.i + 1 : end], True))
                lexer.i = end + 1
            elif c in "$`":
                parts.append(lexer.dollar(quoted=True))
            else:
                parts.append(Part("text", c, True))
                lexer.i += 1
        return self.joined(Word(parts))

    def split(self, text: str) -> list[str]:
        words = [t for t in _Lexer(text).tokens() if isinstance(t, Word)]
        return [f for w in words for f in self.fields(w)]

    # Statements ------------------------------------------------------------------------------

    def assign(self, word: Word) -> bool:
        """Assign ``NAME=value`` (or ``NAME=( ... )``, ``NAME+=...``); False if not one."""
        match = _assignment(word)
        if not match:
            return False
        first = word.parts[0]
        name, append = match.group(1), match.group(2)
        if word.array is not None:
            items = [f for w in word.array for f in self.fields(w)]
            old = self.vars.get(name, [])
            self.vars[name] = (old if isinstance(old, list) else [old]) + items if append else items
            return True
        rest = Word([Part("text", first.text[match.end() :], False), *word.parts[1:]])
        value = self.joined(rest)
        self.vars[name] = self.value(name) + value if append else value
        return True

    def test(self, words: list[str]) -> bool:
        """Evaluate ``[ ... ]`` / ``[[ ... ]]``: comparisons, -z, -n; anything else is true."""
        inner = [w for w in words if w not in ("[", "]", "[[", "]]", "test")]
        negate = inner[:1] == ["!"]
        inner = inner[1:] if negate else inner
        result = True
        if len(inner) == 3:
            a, op, b = inner
            numeric = {
                "-eq": operator.eq,
                "-ne": operator.ne,
                "-gt": operator.gt,
                "-lt": operator.lt,
                "-ge": operator.ge,
                "-le": operator.le,
            }
            if op in ("=", "=="):
                result = a == b
            elif op == "!=":
                result = a != b
            elif op in numeric and a.lstrip("-").isdigit() and b.lstrip("-").isdigit():
                result = numeric[op](int(a), int(b))
        elif len(inner) == 2 and inner[0] in ("-z", "-n"):
            result = (inner[1] == "") == (inner[0] == "-z")
        elif len(inner) == 1:
            result = inner[0] != ""
        return result != negate


def _assignment(word: Word) -> re.Match | None:
    first = word.parts[0] if word.parts else None
    if first is None or first.kind != "text" or first.quoted:
        return None
    return ASSIGNMENT.match(first.text)


def _commands(tokens: list[Token]) -> list[list[Token]]:
    commands: list[list[Token]] = [[]]
    for token in tokens:
        if isinstance(token, str) and token in SEPARATORS:
            commands.append([])
        else:
            commands[-1].append(token)
    return [c for c in commands if c]


def command_words(script: str, marker: str, env: dict[str, str]) -> list[str] | None:
    """Return the arguments of the first command of ``script`` that has ``marker`` among them
    (the command's own name first, variables of the script and of ``env`` expanded, ``$@``
    empty), or None when no command has it."""
    shell = Shell(env)
    skip: list[str] = []  # closing words of the loops, case blocks and functions being skipped
    branches: list[list[bool]] = []  # per open if: [this branch taken, any branch taken]
    for command in _commands(_Lexer(script).tokens()):
        words = [t for t in command if isinstance(t, Word)]
        heads = [w.literal() for w in words]
        while heads and heads[0] in ("then", "do", "else", "{"):
            if heads[0] == "else" and branches:
                branches[-1][0] = not branches[-1][1]
            words, heads = words[1:], heads[1:]
        head = heads[0] if heads else None
        if skip:
            if head in OPENERS:
                skip.append(OPENERS[head])
            elif head == skip[-1] or (skip[-1] == "}" and "}" in heads):
                skip.pop()
            continue
        if head in OPENERS:
            skip.append(OPENERS[head])
            continue
        if head == "function" or (len(heads) >= 1 and command[1:3] == ["(", ")"]):
            skip.append("}")
            continue
        if head == "fi":
            branches.pop()
            continue
        if head in ("if", "elif"):
            condition = [f for w in words[1:] for f in shell.fields(w)]
            if head == "if":
                taken = (not branches or branches[-1][0]) and shell.test(condition)
                branches.append([taken, taken])
            else:
                taken = not branches[-1][1] and shell.test(condition)
                branches[-1] = [taken, branches[-1][1] or taken]
            continue
        if branches and not all(b[0] for b in branches):
            continue
        if not words:
            continue
        if head in ("export", "declare", "local", "readonly", "typeset"):
            for word in words[1:]:
                shell.assign(word)  # options (-x, -a) are not assignments
            continue
        if head == "unset":
            for word in words[1:]:
                for name in shell.fields(word):
                    shell.vars.pop(name, None)
            continue
        prefix = 0  # NAME=value words before a command are its environment
        while prefix < len(words) and _assignment(words[prefix]):
            prefix += 1
        if prefix == len(words):
            for word in words:
                shell.assign(word)
            continue
        arguments = _without_redirections(command, shell)
        if marker in arguments:
            return arguments[sum(len(shell.fields(w)) for w in words[:prefix]) :]
    return None


def _without_redirections(command: list[Token], shell: Shell) -> list[str]:
    out: list[str] = []
    tokens = iter(command)
    for token in tokens:
        if isinstance(token, Word):
            out += shell.fields(token)
        elif REDIRECTIONS.fullmatch(token):
            next(tokens, None)  # the redirection's file, or the descriptor of 2>&1
    return out
