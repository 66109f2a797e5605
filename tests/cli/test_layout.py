"""The CLI's layout, walked by name: every command in ``--help`` is one module of
``builder/cli/`` (its group's) and one ``run_<command>`` of a stage; no command is hidden;
a command accepts exactly the flags its handler reads (a parser walk over every command and
mode, reading the handlers' source); the shared options are declared once; the flag slots
stay at or under 160; the exit-status table is one table, rendered into ``--help`` and the
docs."""

from __future__ import annotations

import argparse
import ast
import importlib
import inspect
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from builder.cli import common
from builder.cli.main import GROUPS, build_parser, main, resolve_project_paths, walk_commands
from builder.core.errors import EXIT_STATUSES, exit_status_markdown, exit_status_text
from tests.helpers.paths import REPO

#: Commands whose stage function is not named ``run_<command>``, each with why. Also in
#: docs/pipeline.md ("Commands and their code").
EQUIVALENTS: dict[tuple[str, ...], str] = {
    # reading the targets file is the whole command
    ("targets",): "builder.core.config:load_targets",
    # public API names (builder/__init__.py): a target may give several wheels
    ("wheel",): "builder.wheel.build:run_wheels",
    ("kernels", "build"): "builder.kernels.run:run_kernels",  # mode "host"
    ("kernels", "container"): "builder.kernels.run:run_kernels",  # mode "container"
    ("kernels", "plan"): "builder.kernels.request:derived_request",
    ("release", "image"): "builder.release.run:run_release",
    ("smoke", "host"): "builder.smoke.gpu:run_smoke",  # mode "host"
    ("smoke", "image"): "builder.smoke.gpu:run_smoke",  # mode "image"
    # the cache belongs to the core: every stage writes it
    ("cache", "list"): "builder.core.cache:cache_entries",
    ("cache", "prune"): "builder.core.cache:prune_cache",
    ("cache", "clean"): "builder.core.cache:prune_cache",
}
#: Attributes of the parsed arguments that are argparse's bookkeeping, not flags.
BOOKKEEPING = {"handler", "validate", "command", "command_parser", "command_path", "shared",
               "help"}
MAX_FLAG_SLOTS = 160


def _leaves() -> list[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    return list(walk_commands(build_parser()))


def _functions(fn: Callable[..., Any], seen: set[Any] | None = None
               ) -> list[tuple[Callable[..., Any], ast.AST]]:
    """``fn`` and every function of :mod:`builder.cli` it calls with ``args``, parsed."""
    seen = set() if seen is None else seen
    if fn in seen:
        return []
    seen.add(fn)
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    found = [(fn, tree)]
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and any(
                isinstance(arg, ast.Name) and arg.id == "args" for arg in node.args):
            callee = fn.__globals__.get(node.func.id)
            if inspect.isfunction(callee) and callee.__module__.startswith("builder.cli"):
                found += _functions(callee, seen)
    return found


def _reads(functions: list[tuple[Callable[..., Any], ast.AST]]) -> set[str]:
    """The attributes of ``args`` the functions read (``args.x``, ``getattr(args, "x")``,
    ``"x" in args``)."""
    names: set[str] = set()
    for _, tree in functions:
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and \
                    node.value.id == "args":
                names.add(node.attr)
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
                    node.func.id == "getattr" and len(node.args) >= 2 and \
                    isinstance(node.args[0], ast.Name) and node.args[0].id == "args" and \
                    isinstance(node.args[1], ast.Constant):
                names.add(str(node.args[1].value))
    return names


def _stage_calls(functions: list[tuple[Callable[..., Any], ast.AST]]) -> set[str]:
    """``module:function`` of each stage function the handler imports and calls."""
    imported: dict[str, str] = {}
    called: set[str] = set()
    for _, tree in functions:
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("builder."):
                for alias in node.names:
                    imported[alias.asname or alias.name] = node.module or ""
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                called.add(node.func.id)
    return {f"{imported[name]}:{name}" for name in called & set(imported)
            if not imported[name].startswith("builder.cli")}


def _declared(parser: argparse.ArgumentParser) -> set[str]:
    """The dests of the flags and arguments ``parser`` accepts itself and of the shared
    options it reads."""
    own = {action.dest for action in parser._actions
           if not isinstance(action, argparse._HelpAction | argparse._SubParsersAction)}
    return own | set(parser.get_default("shared"))


def test_every_command_is_one_module_and_one_stage_function() -> None:
    group_of = {name: module for _, module, names in GROUPS for name in names}
    checked = 0
    for path, parser in _leaves():
        handler = parser.get_default("handler")
        assert handler is not None, f"{' '.join(path)} has no handler"
        assert handler.__module__ == group_of[path[0]].__name__, (
            f"{' '.join(path)} is handled in {handler.__module__}, not in its group's "
            f"module {group_of[path[0]].__name__}")
        expected = EQUIVALENTS.get(path, "run_" + "_".join(path).replace("-", "_"))
        calls = _stage_calls(_functions(handler))
        matching = [call for call in calls
                    if call == expected or call.split(":")[1] == expected]
        assert len(matching) == 1, (f"{' '.join(path)}: its handler calls {sorted(calls)}, "
                                    f"not one {expected}")
        module, name = matching[0].split(":")
        assert module.split(".")[1] != "core" or path in EQUIVALENTS, (
            f"{' '.join(path)}: {name} is in the core, not a stage")
        assert callable(getattr(importlib.import_module(module), name))
        checked += 1
    assert checked == len(_leaves()) >= 28


def test_no_hidden_command_or_flag() -> None:
    def walk(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> None:
        for action in parser._actions:
            # the root's own list is suppressed: its description lists the commands by group
            assert action.help != argparse.SUPPRESS or (path, action.dest) == ((), "command"), \
                f"{' '.join(path)} hides {action.dest}"
            if isinstance(action, argparse._SubParsersAction):
                listed = {choice.dest for choice in action._choices_actions}
                # an alias or an unlisted name would be a choice without its own help line
                assert set(action.choices) == listed, (path, sorted(action.choices))
                for name, child in action.choices.items():
                    walk(child, (*path, name))
    root = build_parser()
    walk(root)
    (commands,) = [a for a in root._actions if isinstance(a, argparse._SubParsersAction)]
    listed = [name for _, _, names in GROUPS for name in names]
    assert sorted(commands.choices) == sorted(listed)
    for old in ("check", "bump", "publish-wheels", "label"):
        assert old not in commands.choices


@pytest.mark.parametrize("path", [path for path, _ in _leaves()], ids=" ".join)
def test_a_command_accepts_only_the_flags_its_handler_reads(path: tuple[str, ...]) -> None:
    parser = dict(_leaves())[path]
    functions = _functions(parser.get_default("handler"))
    validate = parser.get_default("validate")
    if validate is not None:
        functions += _functions(validate)
    functions += _functions(main) + _functions(resolve_project_paths)
    read = _reads(functions)
    # resolve_project_paths fills these in by name, for the handlers that read them
    read |= {"pins_file", "dockerfile", "profiles_dir", "gate_series"} & read
    unread = _declared(parser) - read - BOOKKEEPING
    assert not unread, f"{' '.join(path)} accepts {sorted(unread)} but never reads them"


def test_shared_options_are_declared_once_on_the_root() -> None:
    root = build_parser()
    flags = {flag for flag, _ in common.SHARED.values()}
    assert flags <= {o for a in root._actions for o in a.option_strings}
    for path, parser in walk_commands(root):
        own = {o for a in parser._actions for o in a.option_strings}
        assert not own & flags, f"{' '.join(path)} declares {sorted(own & flags)} again"
        assert parser.get_default("shared") <= set(common.SHARED), path


def _flag_slots() -> int:
    """Every (command path, flag) pair in the parser tree, ``--help`` aside."""
    slots = 0

    def walk(parser: argparse.ArgumentParser) -> None:
        nonlocal slots
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for child in action.choices.values():
                    walk(child)
            elif action.option_strings and not isinstance(action, argparse._HelpAction):
                slots += 1
    walk(build_parser())
    return slots


def test_flag_slots_stay_at_or_under_160() -> None:
    assert _flag_slots() <= MAX_FLAG_SLOTS


def test_shared_options_work_after_the_command_and_are_refused_where_unread(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["cache", "list", "--cache-dir", str(tmp_path), "--json"]) == 0
    assert main(["--json", "cache", "list", f"--cache-dir={tmp_path}"]) == 0
    capsys.readouterr()
    with pytest.raises(SystemExit) as done:
        main(["smoke", "host", "--cache-dir", str(tmp_path)])
    assert done.value.code == 2
    assert f"unrecognized arguments: --cache-dir {tmp_path}" in capsys.readouterr().err
    with pytest.raises(SystemExit) as done:  # a mode's flag in the other mode
        main(["kernels", "build", "--docker-host", "unix:///x.sock"])
    assert done.value.code == 2
    assert "unrecognized arguments: --docker-host" in capsys.readouterr().err


def test_a_shared_option_given_twice_with_different_values_is_refused(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as done:  # before and after the command
        main(["--cache-dir", str(tmp_path / "a"), "cache", "list", "--cache-dir",
              str(tmp_path / "b")])
    assert done.value.code == 2
    assert "argument --cache-dir: given twice" in capsys.readouterr().err
    # the same value twice (= or a word) says one thing: taken
    assert main(["cache", "list", "--json", f"--cache-dir={tmp_path}", "--cache-dir",
                 str(tmp_path)]) == 0


def test_exit_statuses_are_one_table_in_help_and_docs(capsys: pytest.CaptureFixture[str]
                                                      ) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    assert exit_status_text() in capsys.readouterr().out
    docs = (REPO / "docs" / "pipeline.md").read_text()
    start, end = "<!-- exit-statuses: builder.core.errors.EXIT_STATUSES -->\n", \
        "<!-- /exit-statuses -->"
    assert start in docs, "docs/pipeline.md has no exit-status table"
    assert docs.split(start, 1)[1].split(end, 1)[0] == exit_status_markdown()
    assert [status for status, _ in EXIT_STATUSES][:8] == [str(n) for n in range(8)]
