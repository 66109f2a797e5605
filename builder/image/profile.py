"""SM120 launch profiles: the serving arguments an image starts SGLang with.

One small TOML file per target (``images/profiles/<target>.toml``): ``target``,
``upstream_version`` and an ``[args]`` table of ``"--option" = value`` (``true`` for a
flag without a value), each with the evidence for it as a comment. The image carries it
as :data:`PROFILE_PATH` (its path and sha256 in labels) next to the launcher
``sglang-sm120-serve`` (:data:`LAUNCHER_PATH`, ``builder/image/data``), which runs
``python -m sglang.launch_server`` with the profile's arguments first and the user's after
them (the user's win). A profile may hold values per GPU and TP size (``[gpu.<name>]``
with ``match``, ``memory_gib``, ``tp_sizes``, ``[gpu.<name>.args]`` and
``[gpu.<name>.tp.<N>]``); :meth:`LaunchProfile.resolve` gives the arguments for one.
What a profile means is read in one place, ``builder/image/data/sglang_sm120_profile.py``
(:data:`READER_SOURCE`, stdlib only): :func:`load_profile`, ``serve-command`` and the
launcher (the image carries the file beside it) all use it, so they agree.

:func:`check_profile` proves every argument list a profile can give is one the pinned
release accepts: for a wheel target by running the release's own argument parser in its
behaviour environment (``builder.behaviour.env``), for an sdist target (no behaviour
environment) by the option names :func:`server_args_options` reads from its
``server_args.py``.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.machinery
import importlib.util
import tomllib
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from builder.behaviour.env import parse_with_release
from builder.core.config import Target
from builder.core.errors import BuildError, ConfigurationError
from builder.core.userfiles import read_input

if TYPE_CHECKING:
    from builder.behaviour.env import BehaviourEnv
    from builder.core.cache import Cache
    from builder.core.progress import Reporter

PROFILE_PATH = "/etc/sglang-sm120/profile.toml"
LAUNCHER_PATH = "/usr/local/bin/sglang-sm120-serve"
LAUNCHER_SOURCE = Path(__file__).resolve().parent / "data" / "sglang-sm120-serve"
#: The one reader of profiles (stdlib only): the launcher imports it from its own folder,
#: the image carries it beside the launcher, the builder loads it from here.
READER_SOURCE = LAUNCHER_SOURCE.parent / "sglang_sm120_profile.py"
#: What the launcher loads from its own folder (links in ``builder/image/data``, the files
#: themselves in the image), stdlib only: the profile reader, the kernel coverage rules
#: (``builder.kernels.coverage``), the pruned fused MoE rules they use
#: (``builder.kernels.prune``) and the arch rules (``builder.core.arch``).
BESIDE_SOURCES = (READER_SOURCE, LAUNCHER_SOURCE.parent / "sglang_sm120_coverage.py",
                  LAUNCHER_SOURCE.parent / "sglang_sm120_prune.py",
                  LAUNCHER_SOURCE.parent / "sglang_sm120_arch.py")
#: The folder beside the launcher holding the release's backend selection
#: (``builder/behaviour/script``'s files: ``select_backends.py`` and its neighbours), which
#: the launcher runs with the image's own sglang before the server starts (issue 36).
SELECT_FOLDER = "sglang_sm120_select"
PROFILES_DIR = Path("images/profiles")
#: The model path the checks parse with (the parser only needs one to be given).
CHECK_MODEL = "/models/check"


def _load(name: str, path: Path) -> ModuleType:
    loader = importlib.machinery.SourceFileLoader(name, str(path))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


@cache
def launcher_module() -> ModuleType:
    """The launcher ``sglang-sm120-serve`` loaded as a module (its server environment)."""
    return _load("sglang_sm120_serve", LAUNCHER_SOURCE)


@cache
def profile_reader() -> ModuleType:
    """``sglang_sm120_profile.py``, the one reader of launch profiles (what a profile means,
    the TP size the user's arguments give), as the image's launcher runs it."""
    return _load("sglang_sm120_profile", READER_SOURCE)


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
    gpus: dict[str, Any] = field(default_factory=dict)

    def options(self) -> list[str]:
        """The options the profile passes (``false`` ones are left out)."""
        return [option for option, value in self.args.items() if value is not False]

    def combinations(self) -> list[tuple[str | None, int | None]]:
        """Every (GPU, TP size) the profile has; ``(None, None)`` (common [args] only)
        first, as the launcher passes them when it knows no GPU."""
        return [(None, None), *((gpu, tp) for gpu, entry in self.gpus.items()
                                for tp in entry["tp_sizes"])]

    def resolve(self, gpu: str | None, tp: int | None) -> dict[str, Any]:
        """The arguments for ``gpu`` at TP ``tp`` (``gpu`` None: the common [args]).

        Raises:
            ConfigurationError: the profile has no such GPU or TP size.
        """
        reader = profile_reader()
        try:
            args: dict[str, Any] = reader.resolve_args(
                {"args": self.args, "gpu": self.gpus}, gpu, tp)
        except reader.ProfileError as exc:
            raise ConfigurationError(f"{self.path}: {exc}",
                                     "pick one of the GPUs and TP sizes it lists") from None
        return args

    def argv(self, gpu: str | None, tp: int | None, given: set[str] | None = None
             ) -> list[str]:
        """:meth:`resolve` as the argv the launcher passes (``given`` options left out)."""
        return list(profile_reader().to_argv(self.resolve(gpu, tp), given or set()))


def profile_path(profiles_dir: Path, target: Target) -> Path:
    """``<profiles_dir>/<target name>.toml``."""
    return profiles_dir / f"{target.name}.toml"


def load_profile(path: Path, target: Target) -> LaunchProfile:
    """Read and check a target's launch profile.

    Args:
        path: the profile file.
        target: the target it must be for (its ``upstream_version`` must match, and its
            ``target``, when it names one).

    Returns:
        the :class:`LaunchProfile`.

    Raises:
        BuilderError: missing, not TOML, for another target or release, or a key or value
            that ``sglang_sm120_profile.check_table`` refuses (an ``[args]`` entry that is
            not ``"--option" = string / number / true / false / list``, a TP size in a
            table, a ``[gpu.NAME.tp.N]`` key not written as in ``tp_sizes``, ...).
    """
    hint = (f"write {path} (copy the nearest release's profile and check its options), or "
            "pass --launch-profile FILE")
    if not path.exists() and not path.is_symlink():
        raise ConfigurationError(f"no SM120 launch profile for target {target.name}: {path} not "
                                 "found", hint)
    raw = read_input(path, "the launch profile", hint)
    try:
        data = tomllib.loads(raw.decode())
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigurationError(f"{path} is not valid TOML: {exc}", "fix the file") from None
    reader = profile_reader()
    try:
        reader.check_table(data, target=target.name,
                           upstream_version=str(target.upstream_version))
    except reader.ProfileError as exc:
        raise ConfigurationError(f"{path}: {exc}", exc.hint) from None
    args, gpus = data["args"], data.get("gpu", {})
    return LaunchProfile(path, raw.decode(), args, hashlib.sha256(raw).hexdigest(), gpus)


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


@dataclass(frozen=True)
class ProfileCheck:
    """What :func:`check_profile` found.

    Attributes:
        method: ``"parser"`` (the release's own argument parser ran) or ``"names"`` (the
            option names of its ``server_args.py``: sdist targets).
        checked: one entry per (GPU, TP) combination: ``gpu``, ``tp``, ``argv``.
    """

    method: str
    checked: tuple[dict[str, Any], ...]


def release_env(target: Target, *, cache: Cache, index_url: str | None = None,
                reporter: Reporter | None = None) -> BehaviourEnv:
    """The behaviour environment of the target's pinned wheel for this interpreter (fetched
    and installed once, then found in the cache).

    Raises:
        ConfigurationError: the target pins no wheel for this Python.
        SourceError: the wheel could not be fetched.
        BuildError: the environment could not be installed.
    """
    from builder.behaviour.env import behaviour_env
    from builder.behaviour.run import wheel_for_interpreter
    from builder.source.fetch import fetch_pin

    pin = wheel_for_interpreter(target)
    source = fetch_pin(pin, target.upstream_version, cache=cache, index_url=index_url,
                       reporter=reporter)
    assert source.archive is not None  # a wheel pin always has its file
    return behaviour_env(source.archive, str(target.upstream_version), cache=cache,
                         reporter=reporter)


def check_profile(profile: LaunchProfile, target: Target, *, cache: Cache,
                  index_url: str | None = None, reporter: Reporter | None = None
                  ) -> ProfileCheck:
    """Refuse a profile that gives the pinned release an option it does not accept.

    Every (GPU, TP) combination of the profile is turned into the launcher's argv (with a
    model path) and checked: wheel targets (0.5.11 and later) by the release's own parser
    (``builder.behaviour.env.parse_with_release``; unknown options, wrong types and choices
    fail), sdist targets by :func:`server_args_options` over the sdist's ``server_args.py``
    (names only).

    Args:
        profile: the loaded profile.
        target: its target.
        cache: where the release and its behaviour environment are (downloaded once).
        index_url: the index to fetch the pinned release from (default PyPI).
        reporter: progress.

    Returns:
        the :class:`ProfileCheck`.

    Raises:
        ConfigurationError: an argument list the release refuses (its message and the
            GPU / TP it came from).
        SourceError: the release could not be fetched.
        BuildError: its behaviour environment could not be installed or run.
    """
    from builder.core.config import GitPin, WheelPin
    from builder.source.fetch import fetch_pin

    combos = profile.combinations()
    argvs = [["--model-path", CHECK_MODEL, *profile.argv(gpu, tp)] for gpu, tp in combos]
    checked: tuple[dict[str, Any], ...] = tuple(
        {"gpu": gpu, "tp": tp, "argv": argv}
        for (gpu, tp), argv in zip(combos, argvs, strict=True))
    release = str(target.upstream_version)
    if any(isinstance(pin, WheelPin) for pin in target.sources):
        env = release_env(target, cache=cache, index_url=index_url, reporter=reporter)
        for item, answer in zip(checked, parse_with_release(env, argvs), strict=True):
            if not answer["ok"]:
                raise ConfigurationError(
                    f"{profile.path} ({_combo(item)}): sglang {release}'s own argument "
                    f"parser refuses it: {answer['error']}",
                    f"use only options sglang {release} has, with its types and choices "
                    "(`python -m sglang.launch_server --help` of that release)")
        return ProfileCheck("parser", checked)
    # The sdist where there is one: a git pin needs GitHub, the index is what the wheel uses.
    pin = next((p for p in target.sources if not isinstance(p, GitPin)), target.sources[0])
    source = fetch_pin(pin, target.upstream_version, cache=cache, index_url=index_url,
                       reporter=reporter)
    texts = [p.read_text() for p in source.tree.rglob("server_args.py")
             if p.parent.name == "srt"]
    if len(texts) != 1:
        raise BuildError(f"sglang {release}: sglang/srt/server_args.py not found once in "
                         f"{source.tree}", "check the pinned source")
    known = server_args_options(*texts)
    for item in checked:
        unknown = [a for a in item["argv"] if a.startswith("--") and a not in known]
        if unknown:
            raise ConfigurationError(
                f"{profile.path} ({_combo(item)}): sglang {release} has no option "
                f"{', '.join(unknown)}", f"use only options sglang {release} defines "
                "(its server_args.py)")
    return ProfileCheck("names", checked)


def _combo(item: dict[str, Any]) -> str:
    return "common [args]" if item["gpu"] is None else f"GPU {item['gpu']}, TP {item['tp']}"
