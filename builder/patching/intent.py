"""Intent checks: what a patch means, checked on the patched tree.

A patch that applied is not yet a patch that did the right thing. Each series entry may
declare checks, evaluated after the whole series (and, for reports, before it):

``literal-contains``
    A list/tuple/set literal, live code (the syntax tree, so comments never count),
    contains a constant. Scope it with ``function`` (literals inside a function or
    method of that name, or of any name in a list: upstream renames things) or
    ``assignment`` (literals assigned to that name); with ``compared_with`` only
    literals used in an ``in``/``not in`` test against that name count, directly or
    through a local variable assigned from an expression that mentions it
    (``backend = self.server_args.moe_runner_backend`` then ``backend not in [...]``).
``regex-present`` / ``regex-absent``
    A Python regular expression (multiline mode) must / must not match the file.

``file`` is a repository path, or an ``fnmatch`` pattern (``*`` also crosses ``/``)
for code that upstream moves between files: a check holds when it holds in one of the
matching files (``regex-absent``: in all of them; a ``function``-scoped
``literal-contains``: in every matching file that defines the function, so a stale copy
elsewhere can neither pass nor hide the check).

Only code in effect counts: of several definitions of one function in the same scope
(a class body, a module, a function), the last one is the one Python keeps; earlier ones
are dead and are not judged. A regular expression is compiled when the series is loaded
and runs under a time bound (:data:`REGEX_TIMEOUT_S`, with the ``regex`` package's
``timeout``): a pattern that backtracks catastrophically is an error, not a hang.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Literal, Protocol

from builder.core.errors import ConfigurationError, PatchError

#: Seconds one intent regex may run on one file before the check is an error.
REGEX_TIMEOUT_S = 5.0

IntentKind = Literal["literal-contains", "regex-present", "regex-absent"]
INTENT_KINDS: tuple[IntentKind, ...] = ("literal-contains", "regex-present", "regex-absent")


class RepoReader(Protocol):
    """Read access to a (possibly patched) tree by repository path."""

    def read_repo_path(self, repo_path: str) -> str | None:
        """The file's text, or ``None`` if it does not exist."""

    def glob_repo_paths(self, pattern: str) -> list[str]:
        """Existing repository paths matching an ``fnmatch`` pattern, sorted."""


def is_pattern(path: str) -> bool:
    """True when ``path`` holds ``fnmatch`` wildcards."""
    return any(char in path for char in "*?[")


def pattern_root(pattern: str) -> str:
    """The folder part of ``pattern`` before its first wildcard (where to start a walk)."""
    head = re.split(r"[*?\[]", pattern, maxsplit=1)[0]
    return head.rsplit("/", 1)[0] if "/" in head else ""


@dataclass(frozen=True)
class IntentOutcome:
    """The result of one check on one tree.

    Attributes:
        holds: whether the check is satisfied.
        detail: one line saying where it held, or why not.
    """

    holds: bool
    detail: str


@dataclass(frozen=True)
class IntentCheck:
    """One declared check. ``file`` is a repository path (``python/sglang/...``)."""

    kind: IntentKind
    file: str
    value: str | None = None
    function: tuple[str, ...] = ()
    assignment: str | None = None
    compared_with: str | None = None
    pattern: str | None = None

    def describe(self) -> str:
        """Return a one-line human description of the check."""
        if self.kind == "literal-contains":
            scope = (f"function {' or '.join(self.function)}" if self.function
                     else f"assignment {self.assignment}")
            against = f" compared with {self.compared_with}" if self.compared_with else ""
            return f"{self.file}: a literal in {scope}{against} contains {self.value!r}"
        verb = "matches" if self.kind == "regex-present" else "does not match"
        return f"{self.file}: /{self.pattern}/ {verb}"

    def evaluate_tree(self, reader: RepoReader) -> IntentOutcome:
        """Evaluate the check on a tree (every file ``file`` names or matches)."""
        if not is_pattern(self.file):
            return self.evaluate(reader.read_repo_path(self.file))
        paths = reader.glob_repo_paths(self.file)
        if not paths:
            return IntentOutcome(False, f"no file matches {self.file}")
        if self.kind == "literal-contains" and self.function:
            return self._every_definition(reader, paths)
        if self.kind != "regex-absent":
            outcomes = []
            for path in paths:
                text = reader.read_repo_path(path)
                # Cheap text filter first: a file without the value cannot hold it.
                if text is None or (self.value is not None and self.value not in text):
                    continue
                outcome = self.evaluate(text)
                if outcome.holds:
                    return IntentOutcome(True, f"{path}: {outcome.detail}")
                outcomes.append(f"{path}: {outcome.detail}")
            return IntentOutcome(False, "; ".join(outcomes[:3]) or
                                 f"{self.value or self.pattern!r} not found in {self.file}")
        for path in paths:  # regex-absent: must hold everywhere
            outcome = self.evaluate(reader.read_repo_path(path))
            if not outcome.holds:
                return IntentOutcome(False, f"{path}: {outcome.detail}")
        return IntentOutcome(True, f"pattern absent from {len(paths)} files")

    def _every_definition(self, reader: RepoReader, paths: list[str]) -> IntentOutcome:
        """A function-scoped check over several files: it must hold in each that defines
        the function (a stale copy in another file is not taken as proof)."""
        judged: list[tuple[str, IntentOutcome]] = []
        for path in paths:
            text = reader.read_repo_path(path)
            if text is None or not any(name in text for name in self.function):
                continue
            try:
                defined = any(node.name in self.function
                              for node in live_definitions(ast.parse(text)))
            except SyntaxError:
                defined = True  # let evaluate() say where it does not parse
            if defined:
                judged.append((path, self.evaluate(text)))
        if not judged:
            return IntentOutcome(False, f"function {' or '.join(self.function)} not found "
                                        f"in {self.file}")
        failed = [f"{path}: {o.detail}" for path, o in judged if not o.holds]
        if failed:
            return IntentOutcome(False, "; ".join(failed[:3]))
        return IntentOutcome(True, "; ".join(f"{path}: {o.detail}" for path, o in judged))

    def evaluate(self, text: str | None) -> IntentOutcome:
        """Evaluate the check on one file's text (``None``: the file does not exist)."""
        if text is None:
            return IntentOutcome(False, f"{self.file} does not exist")
        if self.kind == "regex-present" or self.kind == "regex-absent":
            assert self.pattern is not None
            try:
                found = compile_pattern(self.pattern).search(text, timeout=REGEX_TIMEOUT_S)
            except TimeoutError:
                raise PatchError(
                    f"intent regex /{self.pattern}/ on {self.file} ran longer than "
                    f"{REGEX_TIMEOUT_S:g} s (catastrophic backtracking)",
                    "rewrite the pattern without nested repetition such as (a+)+ or "
                    "(.*)*; anchor it, or match a literal line") from None
            line = text.count("\n", 0, found.start()) + 1 if found else 0
            if self.kind == "regex-present":
                return IntentOutcome(bool(found), f"matches at line {line}" if found
                                     else "pattern not found")
            return IntentOutcome(not found, f"unexpected match at line {line}" if found
                                 else "pattern absent")
        return self._literal_contains(text)

    def _literal_contains(self, text: str) -> IntentOutcome:
        try:
            tree = ast.parse(text)
        except SyntaxError as exc:
            return IntentOutcome(False, f"{self.file} does not parse: line {exc.lineno}: "
                                        f"{exc.msg}")
        scopes: list[ast.AST]
        if self.function:
            scopes = [node for node in live_definitions(tree) if node.name in self.function]
            if not scopes:
                return IntentOutcome(False, f"function {' or '.join(self.function)} "
                                            "not found")
        else:
            scopes = [tree]
        literals: list[ast.List | ast.Tuple | ast.Set] = []
        for scope in scopes:
            literals.extend(self._candidate_literals(scope))
        if not literals:
            return IntentOutcome(False, "no matching list/tuple/set literal found")
        for literal in literals:
            for element in literal.elts:
                if isinstance(element, ast.Constant) and element.value == self.value:
                    return IntentOutcome(True, f"{self.value!r} is live at line "
                                               f"{element.lineno}")
        lines = ", ".join(str(lit.lineno) for lit in literals)
        return IntentOutcome(False, f"{self.value!r} is not in the literal(s) at line(s) "
                                    f"{lines}")

    def _candidate_literals(self, scope: ast.AST) -> list[ast.List | ast.Tuple | ast.Set]:
        literal_types = (ast.List, ast.Tuple, ast.Set)
        found: list[ast.List | ast.Tuple | ast.Set] = []
        if self.assignment:
            for node in ast.walk(scope):
                targets: list[ast.expr] = []
                if isinstance(node, ast.Assign):
                    targets = node.targets
                elif isinstance(node, ast.AnnAssign):
                    targets = [node.target]
                value = getattr(node, "value", None)
                if isinstance(value, literal_types) and any(
                        _terminal_name(t) == self.assignment for t in targets):
                    found.append(value)
            return found
        aliases = self._aliases(scope)
        for node in ast.walk(scope):
            if self.compared_with is None:
                if isinstance(node, literal_types):
                    found.append(node)
                continue
            if not isinstance(node, ast.Compare):
                continue
            operands = [node.left, *node.comparators]
            for index, op in enumerate(node.ops):
                if not isinstance(op, ast.In | ast.NotIn):
                    continue
                left, right = operands[index], operands[index + 1]
                if isinstance(right, literal_types) and _terminal_name(left) in aliases:
                    found.append(right)
        return found

    def _aliases(self, scope: ast.AST) -> set[str]:
        """Names that stand for ``compared_with``: itself plus locals assigned from it."""
        if self.compared_with is None:
            return set()
        names = {self.compared_with}
        for node in ast.walk(scope):
            if isinstance(node, ast.Assign) and any(
                    _terminal_name(part) in names for part in ast.walk(node.value)):
                names.update(n for t in node.targets if (n := _terminal_name(t)))
        return names


_Def = ast.FunctionDef | ast.AsyncFunctionDef


def live_definitions(tree: ast.AST) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    """Every function definition in ``tree`` that is in effect.

    A ``def`` followed, in the same statement list, by another ``def`` of the same name
    is dead: executing the later one rebinds the name (Python's language reference,
    "Function definitions"). Definitions in separate branches (``if``/``else``,
    ``try``/``except``) are each kept, since either may run.

    Args:
        tree: a parsed module.

    Returns:
        The live definitions, in source order; dead ones and everything nested in them
        are left out.
    """
    live: list[ast.FunctionDef | ast.AsyncFunctionDef] = []

    def visit_block(statements: list[ast.stmt]) -> None:
        last = {node.name: index for index, node in enumerate(statements)
                if isinstance(node, _Def)}
        for index, node in enumerate(statements):
            if isinstance(node, _Def):
                if last[node.name] != index:
                    continue  # overridden later in this block: dead code
                live.append(node)
            visit(node)

    def visit(node: ast.AST) -> None:
        for name in ("body", "orelse", "finalbody"):
            block = getattr(node, name, None)
            if isinstance(block, list) and block and isinstance(block[0], ast.stmt):
                visit_block(block)
        for handler in getattr(node, "handlers", []) or []:
            visit_block(handler.body)
        for case in getattr(node, "cases", []) or []:
            visit_block(case.body)

    visit(tree)
    return sorted(live, key=lambda n: (n.lineno, n.col_offset))


@lru_cache(maxsize=256)
def compile_pattern(pattern: str) -> Any:
    """Compile an intent regex (multiline mode) with the ``regex`` package.

    ``regex`` accepts Python's ``re`` syntax and adds a ``timeout`` to each match, which
    ``re`` lacks (https://pypi.org/project/regex/).

    Raises:
        regex.error: the pattern does not compile.
    """
    import regex

    return regex.compile(pattern, regex.MULTILINE)


def _terminal_name(node: ast.AST) -> str | None:
    """``x`` for ``x`` and ``a.b.x``; ``None`` for anything else."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def parse_intent_check(table: dict[str, Any], where: str) -> IntentCheck:
    """Parse one ``[[patch.intent]]`` table of a series file.

    Raises:
        BuilderError: unknown ``check`` kind, missing keys, or a bad regular expression.
    """
    kind = table.get("check")
    if kind not in INTENT_KINDS:
        raise ConfigurationError(f"{where}: unknown intent check {kind!r}",
                                 f"use one of: {', '.join(INTENT_KINDS)}")
    file = table.get("file")
    if not isinstance(file, str) or not file:
        raise ConfigurationError(f"{where}: an intent check needs 'file' (a repository path)",
                                 "for example file = \"python/sglang/srt/server_args.py\"")
    if kind == "literal-contains":
        value = table.get("value")
        function, assignment = table.get("function"), table.get("assignment")
        if not isinstance(value, str) or (function is None) == (assignment is None):
            raise ConfigurationError(f"{where}: literal-contains needs 'value' and exactly one of "
                                     "'function' or 'assignment'", "")
        names = (function,) if isinstance(function, str) else tuple(function or ())
        if function is not None and (not names or not all(isinstance(n, str) for n in names)):
            raise ConfigurationError(f"{where}: 'function' must be a name or a list of names",
                                     'for example function = ["old_name", "new_name"]')
        return IntentCheck(kind=kind, file=file, value=value, function=names,
                           assignment=assignment, compared_with=table.get("compared_with"))
    pattern = table.get("pattern")
    if not isinstance(pattern, str):
        raise ConfigurationError(f"{where}: {kind} needs 'pattern'",
                                 "a Python regular expression, matched in multiline mode")
    import regex

    try:
        compile_pattern(pattern)
    except regex.error as exc:
        raise ConfigurationError(f"{where}: bad regular expression {pattern!r}: {exc}",
                                 "TOML strings need doubled backslashes, or use '...' literals"
                                 ) from None
    return IntentCheck(kind=kind, file=file, pattern=pattern)
