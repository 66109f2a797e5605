"""SM120 launch profiles: the serving arguments an image starts SGLang with.

One small TOML file per target (``images/profiles/<target>.toml``): ``target``,
``upstream_version`` and an ``[args]`` table of ``"--option" = value`` (``true`` for a
flag without a value), each with the evidence for it as a comment. The image carries it
as :data:`PROFILE_PATH` (its path and sha256 in labels) next to the launcher
``sglang-sm120-serve`` (:data:`LAUNCHER_PATH`, ``builder/image/data``), which runs
``python -m sglang.launch_server`` with the profile's arguments first and the user's after
them (the user's win). :func:`server_args_options` reads the options a release knows from
its own ``server_args.py`` so a profile never passes one it does not.
"""

from __future__ import annotations

import ast
import hashlib
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from builder.core.config import Target
from builder.core.errors import ConfigurationError

PROFILE_PATH = "/etc/sglang-sm120/profile.toml"
LAUNCHER_PATH = "/usr/local/bin/sglang-sm120-serve"
LAUNCHER_SOURCE = Path(__file__).resolve().parent / "data" / "sglang-sm120-serve"
PROFILES_DIR = Path("images/profiles")


@dataclass(frozen=True)
class LaunchProfile:
    """A target's launch profile.

    Attributes:
        path: the file.
        text: its bytes as text (what the image carries, comments included).
        args: the ``[args]`` table, in file order.
        sha256: hex sha256 of the file.
    """

    path: Path
    text: str
    args: dict[str, Any]
    sha256: str

    def options(self) -> list[str]:
        """The options the profile passes (``false`` ones are left out)."""
        return [option for option, value in self.args.items() if value is not False]


def profile_path(profiles_dir: Path, target: Target) -> Path:
    """``<profiles_dir>/<target name>.toml``."""
    return profiles_dir / f"{target.name}.toml"


def _value_ok(value: object) -> bool:
    if isinstance(value, list):
        return all(isinstance(item, str | int | float) and not isinstance(item, bool)
                   for item in value)
    return isinstance(value, str | int | float | bool)


def load_profile(path: Path, target: Target) -> LaunchProfile:
    """Read and check a target's launch profile.

    Args:
        path: the profile file.
        target: the target it must be for (its ``upstream_version`` must match).

    Returns:
        the :class:`LaunchProfile`.

    Raises:
        BuilderError: missing, not TOML, for another release, or an ``[args]`` entry
            that is not ``"--option" = string / number / true / false / list``.
    """
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise ConfigurationError(f"no SM120 launch profile for target {target.name}: {path} not "
                                 "found", f"write {path} (copy the nearest release's profile and "
                                 "check its options), or pass --launch-profile FILE") from None
    try:
        data = tomllib.loads(raw.decode())
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigurationError(f"{path} is not valid TOML: {exc}", "fix the file") from None
    unknown = set(data) - {"target", "upstream_version", "args"}
    if unknown:
        raise ConfigurationError(f"{path}: unknown keys {sorted(unknown)}",
                                 "only target, upstream_version and [args]")
    if data.get("upstream_version") != str(target.upstream_version):
        raise ConfigurationError(f"{path} is for sglang {data.get('upstream_version')!r}, target "
                                 f"{target.name} is {target.upstream_version}",
                                 "use the profile written for this release")
    args = data.get("args")
    if not isinstance(args, dict):
        raise ConfigurationError(f"{path} has no [args] table", "add [args] (it may be empty)")
    for option, value in args.items():
        if not option.startswith("--") or not _value_ok(value):
            raise ConfigurationError(f"{path} [args]: {option!r} = {value!r} is not an option with "
                                     "a string, number, true/false or list value",
                                     'write it like "--max-running-requests" = 128')
    return LaunchProfile(path, raw.decode(), args, hashlib.sha256(raw).hexdigest())


def server_args_options(*sources: str) -> set[str]:
    """The command-line options an SGLang release's server arguments define.

    Three styles, read from the syntax tree (nothing imported, no GPU stack needed):

    - ``parser.add_argument("--x", ...)`` (every release);
    - from 0.5.16, fields annotated ``A[...]`` of the ``ServerArgs`` record in
      ``sglang/srt/server_args.py``;
    - from 0.5.2x, the same fields moved to namespace classes in
      ``sglang/srt/arg_groups/fields/*.py``, the ones ``server_args.py`` lists in
      ``_INPUT_NAMESPACES``.

    A field's option is its name with ``-`` (or the ``Arg(cli_name=...)`` given), plus
    ``Arg(aliases=[...])`` and, for ``Arg(action=argparse.BooleanOptionalAction)``, the
    ``--no-`` form. A field with neither help text nor ``Arg(...)`` in its annotation, or
    with ``Arg(no_cli=True)``, has no option. This is what
    ``sglang/srt/arg_groups/arg_utils.py`` (``add_cli_args_from_dataclass``) registers.

    Args:
        sources: the text of ``sglang/srt/server_args.py``, and of any module that
            declares its fields (``sglang/srt/arg_groups/**.py``); order does not matter.

    Returns:
        every ``--option`` found.
    """
    trees = [ast.parse(source) for source in sources]
    records = {"ServerArgs"} | {name for tree in trees for name in _input_namespaces(tree)}
    found: set[str] = set()
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                    node.func.attr == "add_argument":
                found |= {arg.value for arg in node.args if isinstance(arg, ast.Constant)
                          and isinstance(arg.value, str) and arg.value.startswith("--")}
            if isinstance(node, ast.ClassDef) and node.name in records:
                for item in node.body:
                    found |= _field_options(item)
    return found


def _input_namespaces(tree: ast.Module) -> list[str]:
    """Class names in a module-level ``_INPUT_NAMESPACES = [...]`` (0.5.2x server_args.py)."""
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.List) and any(
                isinstance(t, ast.Name) and t.id == "_INPUT_NAMESPACES" for t in node.targets):
            return [e.id for e in node.value.elts if isinstance(e, ast.Name)]
    return []


def _field_options(item: ast.stmt) -> set[str]:
    """The options of one ``name: A[type, "help" | Arg(...)] = default`` field."""
    if not (isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)
            and isinstance(item.annotation, ast.Subscript)
            and isinstance(item.annotation.value, ast.Name)
            and item.annotation.value.id == "A"):
        return set()
    meta = item.annotation.slice.elts[1:] if isinstance(item.annotation.slice, ast.Tuple) \
        else []
    arg = next((m for m in meta if isinstance(m, ast.Call) and isinstance(m.func, ast.Name)
                and m.func.id == "Arg"), None)
    if arg is None:  # a bare string is the help text; anything else registers nothing
        has_help = any(isinstance(m, ast.Constant | ast.JoinedStr | ast.BinOp)
                       for m in meta)
        return {"--" + item.target.id.replace("_", "-")} if has_help else set()
    keywords = {keyword.arg: keyword.value for keyword in arg.keywords}
    no_cli = keywords.get("no_cli")
    if isinstance(no_cli, ast.Constant) and no_cli.value is True:
        return set()
    cli_name = keywords.get("cli_name")
    name = str(cli_name.value) if isinstance(cli_name, ast.Constant) else \
        "--" + item.target.id.replace("_", "-")
    names = [name]
    aliases = keywords.get("aliases")
    if isinstance(aliases, ast.List):
        names += [str(e.value) for e in aliases.elts if isinstance(e, ast.Constant)]
    action = keywords.get("action")
    if isinstance(action, ast.Attribute) and action.attr == "BooleanOptionalAction":
        names += ["--no-" + n[2:] for n in names if n.startswith("--")]
    return set(names)
