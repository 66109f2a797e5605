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
from builder.core.errors import BuilderError

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
        raise BuilderError(f"no SM120 launch profile for target {target.name}: {path} not "
                           "found", f"write {path} (copy the nearest release's profile and "
                           "check its options), or pass --launch-profile FILE") from None
    try:
        data = tomllib.loads(raw.decode())
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise BuilderError(f"{path} is not valid TOML: {exc}", "fix the file") from None
    unknown = set(data) - {"target", "upstream_version", "args"}
    if unknown:
        raise BuilderError(f"{path}: unknown keys {sorted(unknown)}",
                           "only target, upstream_version and [args]")
    if data.get("upstream_version") != str(target.upstream_version):
        raise BuilderError(f"{path} is for sglang {data.get('upstream_version')!r}, target "
                           f"{target.name} is {target.upstream_version}",
                           "use the profile written for this release")
    args = data.get("args")
    if not isinstance(args, dict):
        raise BuilderError(f"{path} has no [args] table", "add [args] (it may be empty)")
    for option, value in args.items():
        if not option.startswith("--") or not _value_ok(value):
            raise BuilderError(f"{path} [args]: {option!r} = {value!r} is not an option with "
                               "a string, number, true/false or list value",
                               'write it like "--max-running-requests" = 128')
    return LaunchProfile(path, raw.decode(), args, hashlib.sha256(raw).hexdigest())


def server_args_options(source: str) -> set[str]:
    """The command-line options an SGLang release's ``server_args.py`` defines.

    Two styles, read from the syntax tree (nothing imported, no GPU stack needed):
    ``parser.add_argument("--x", ...)`` (every release), and from 0.5.16 the
    ``ServerArgs`` dataclass fields annotated ``A[...]`` whose option is the field name
    with ``-`` (or the ``Arg(cli_name=...)`` given), plus ``Arg(aliases=[...])``, as
    ``sglang/srt/arg_groups/arg_utils.py`` (``add_cli_args_from_dataclass``) builds them.

    Args:
        source: the text of ``sglang/srt/server_args.py``.

    Returns:
        every ``--option`` found.
    """
    tree = ast.parse(source)
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                node.func.attr == "add_argument":
            found |= {arg.value for arg in node.args if isinstance(arg, ast.Constant)
                      and isinstance(arg.value, str) and arg.value.startswith("--")}
        if isinstance(node, ast.ClassDef) and node.name == "ServerArgs":
            for item in node.body:
                if not (isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)
                        and isinstance(item.annotation, ast.Subscript)
                        and isinstance(item.annotation.value, ast.Name)
                        and item.annotation.value.id == "A"):
                    continue
                name = "--" + item.target.id.replace("_", "-")
                for call in ast.walk(item.annotation):
                    if isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and \
                            call.func.id == "Arg":
                        for keyword in call.keywords:
                            value = keyword.value
                            if keyword.arg == "cli_name" and isinstance(value, ast.Constant):
                                name = str(value.value)
                            if keyword.arg == "aliases" and isinstance(value, ast.List):
                                found |= {str(e.value) for e in value.elts
                                          if isinstance(e, ast.Constant)}
                found.add(name)
    return found
