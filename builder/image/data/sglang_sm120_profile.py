"""What an SM120 launch profile means: the one reader of ``images/profiles/<target>.toml``.

Every reader of a profile goes through this module: the builder's profile check
(``builder.image.profile.load_profile``), ``serve-command`` (``builder.image.serve``) and the
image's launcher ``sglang-sm120-serve``, which imports it from its own folder (the image
build copies this file beside the launcher, byte for byte: ``builder.image.build._context``).
So a profile is valid, and gives the same server arguments, in one place only.

The rules:

- Top-level keys: ``target`` (a string: the target it is for), ``upstream_version`` (a
  string), ``[args]`` (a table) and ``[gpu.<name>]`` tables; nothing else.
- An argument table maps ``"--option"`` (``--`` then letters, digits, ``-`` or ``_``) to a
  string, a finite number, ``true``/``false`` or a non-empty list of strings and finite
  numbers. The TP size is never an argument of a table (it is the entry's:
  :func:`resolve_args` adds ``--tp-size``).
- ``[gpu.<name>]``: ``name`` and ``match`` strings, ``memory_gib`` a positive number,
  ``tp_sizes`` a non-empty list of positive integers, ``[gpu.<name>.args]`` and
  ``[gpu.<name>.tp.<N>]`` with ``N`` written as the launcher looks it up (``4``, never
  ``04`` or ``+4``) and one of ``tp_sizes``.
- The TP size the server runs with is read from the user's arguments the way SGLang's
  argument parser reads them (``--tp-size`` / ``--tensor-parallel-size``, with a value or
  ``=value``, and any prefix of them argparse expands, such as ``--tp``): every TP given
  must be the same number, or the arguments are refused (:class:`ArgumentError`). The
  caps of the profile are those of that TP size, never of another.

Standard library only, Python 3.11 or newer (it runs inside any image).
"""

from __future__ import annotations

import math
import re
from typing import Any

#: SGLang's spellings of the TP size (``ServerArgs.add_cli_args`` up to 0.5.1x:
#: ``"--tensor-parallel-size", "--tp-size"``; 0.5.2x ``arg_groups/fields/parallel.py``:
#: ``tp_size`` with ``aliases=["--tensor-parallel-size"]``).
TP_NAMES = ("--tp-size", "--tensor-parallel-size")
#: The spelling the profile's part of the command line uses.
TP_OPTION = "--tp-size"
#: The model path at SGLang's parser (``ServerArgs.model_path``, alias ``--model``;
#: 0.5.16-0.5.23). ``--model-p...`` is unambiguous there; ``--model-`` is not (model_impl,
#: model_checksum, model_loader_extra_config).
MODEL_NAMES = ("--model-path", "--model")
#: The request cap, and the CUDA graph bounds that must not exceed it (SGLang 0.5.16-0.5.23
#: ``ServerArgs``: ``max_running_requests``, ``cuda_graph_max_bs``,
#: ``cuda_graph_max_bs_decode``).
MAX_RUNNING = "--max-running-requests"
GRAPH_BOUNDS = ("--cuda-graph-max-bs", "--cuda-graph-max-bs-decode")
TOP_KEYS = ("target", "upstream_version", "args", "gpu")
GPU_KEYS = ("name", "match", "memory_gib", "tp_sizes", "args", "tp")
_OPTION = re.compile(r"--[A-Za-z0-9][A-Za-z0-9_-]*")


class ProfileError(Exception):
    """The profile is not one this module reads, or has no entry for the GPU or TP size
    asked for. ``args[0]`` says what, ``hint`` what to do."""

    def __init__(self, message: str, hint: str = "see images/profiles/") -> None:
        super().__init__(message)
        self.hint = hint


class ArgumentError(ProfileError):
    """The user's server arguments give the TP size in ways that disagree (or not as a
    number)."""


def is_tp_option(option: str) -> bool:
    """Whether ``option`` (no ``=value``) names the TP size at SGLang's parser: one of
    :data:`TP_NAMES`, or a prefix of one that argparse (``allow_abbrev``, the default of
    the release's parser) expands to it; ``--t`` alone is ambiguous there."""
    return len(option) >= 4 and any(name.startswith(option) for name in TP_NAMES)


def is_model_option(option: str) -> bool:
    """Whether ``option`` (no ``=value``) names the model path at SGLang's parser: one of
    :data:`MODEL_NAMES` or a prefix of ``--model-path`` that argparse expands to it."""
    return option in MODEL_NAMES or (option.startswith("--model-p")
                                     and MODEL_NAMES[0].startswith(option))


def option_of(arg: str) -> str | None:
    """The option an argument names (``--x`` of ``--x`` and ``--x=v``), or None for a
    value."""
    return arg.split("=", 1)[0] if arg.startswith("--") else None


def given_options(argv: list[str]) -> set[str]:
    """The profile options the user's ``argv`` replaces: every option named, each TP
    spelling as :data:`TP_OPTION` (a prefix of another option is passed as given and wins
    at the server, which keeps the last value)."""
    given = set()
    for arg in argv:
        option = option_of(arg)
        if option is not None:
            given.add(TP_OPTION if is_tp_option(option) else option)
    return given


def tp_given(argv: list[str]) -> list[tuple[str, int]]:
    """Every TP size ``argv`` gives, as ``(how it was written, the number)``.

    Raises:
        ArgumentError: a TP option without a value, or with one that is not a number.
    """
    found = []
    for index, arg in enumerate(argv):
        option = option_of(arg)
        if option is None or not is_tp_option(option):
            continue
        if "=" in arg:
            text, shown = arg.split("=", 1)[1], arg
        elif index + 1 < len(argv):
            text, shown = argv[index + 1], f"{arg} {argv[index + 1]}"
        else:
            raise ArgumentError(f"{arg} has no value", f"write {arg} N")
        try:
            found.append((shown, int(text)))
        except ValueError:
            raise ArgumentError(f"the TP size in {shown!r} is not a number",
                                f"write {option} N") from None
    return found


def server_tp(argv: list[str], default: int | None = None,
              default_from: str | None = None) -> int | None:
    """The TP size the server runs with: the one ``argv`` gives, else ``default``.

    Args:
        argv: the user's server arguments.
        default: the TP size given another way (``serve-command --tp``; the launcher's
            ``SGLANG_SM120_TP``), or None.
        default_from: how ``default`` was given, when it must agree with ``argv`` (for
            ``serve-command``'s ``--tp``); None: ``argv`` wins over ``default``.

    Returns:
        the TP size, or None when none is given at all.

    Raises:
        ArgumentError: two TP sizes that differ (in ``argv``, or against ``default_from``).
    """
    given = tp_given(argv)
    if default_from is not None and default is not None:
        given = [(default_from, default), *given]
    sizes = {size for _, size in given}
    if len(sizes) > 1:
        raise ArgumentError(
            "the TP size is given more than once, with different values: "
            + ", ".join(shown for shown, _ in given),
            "give the TP size once (the profile's caps are those of one TP size)")
    return given[0][1] if given else default


def _value_ok(value: object) -> bool:
    if isinstance(value, bool | str):
        return True
    if isinstance(value, int | float):
        return math.isfinite(value)
    return isinstance(value, list) and bool(value) and all(
        not isinstance(item, bool | list) and _value_ok(item) for item in value)


def check_args(where: str, args: object) -> None:
    """Refuse an argument table that is not ``"--option" = value`` (module docstring).

    Raises:
        ProfileError: naming ``where`` and the entry.
    """
    if not isinstance(args, dict):
        raise ProfileError(f"{where} is not a table", 'write "--option" = value')
    for option, value in args.items():
        if not _OPTION.fullmatch(option) or not _value_ok(value):
            raise ProfileError(f"{where}: {option!r} = {value!r} is not an option with a "
                               "string, number, true/false or list value",
                               'write it like "--max-running-requests" = 128')
        if is_tp_option(option):
            raise ProfileError(f"{where}: {option!r} sets the TP size",
                               "drop it: the TP size is the user's, and [gpu.NAME.tp.N] "
                               "holds what depends on it")
        if is_model_option(option):  # the user's model always replaces it: never used
            raise ProfileError(f"{where}: {option!r} sets the model path",
                               "drop it: the model is the user's (--model-path)")


def check_gpu(name: str, entry: object) -> None:
    """Refuse a ``[gpu.<name>]`` table that breaks the module docstring's rules.

    Raises:
        ProfileError: naming the table and the entry.
    """
    where = f"[gpu.{name}]"
    if not isinstance(entry, dict):
        raise ProfileError(f"{where} is not a table")
    unknown = set(entry) - set(GPU_KEYS)
    if unknown:
        raise ProfileError(f"{where}: unknown keys {sorted(unknown)}",
                           "only name, match, memory_gib, tp_sizes, args and tp")
    for key in ("name", "match"):
        if key in entry and not (isinstance(entry[key], str) and entry[key]):
            raise ProfileError(f"{where}: {key} = {entry[key]!r} is not a non-empty string",
                               f'write {key} = "..."')
    memory = entry.get("memory_gib", 1)
    if isinstance(memory, bool) or not isinstance(memory, int | float) or \
            not math.isfinite(memory) or memory <= 0:
        raise ProfileError(f"{where}: memory_gib = {memory!r} is not a positive number",
                           "write memory_gib = 96")
    sizes = entry.get("tp_sizes")
    if not (isinstance(sizes, list) and sizes and all(
            isinstance(s, int) and not isinstance(s, bool) and s > 0 for s in sizes)):
        raise ProfileError(f"{where}: tp_sizes must be a list of positive integers",
                           "write tp_sizes = [1, 2, 4, 8]")
    check_args(f"{where} args", entry.get("args", {}))
    per_tp = entry.get("tp", {})
    if not isinstance(per_tp, dict):
        raise ProfileError(f"{where} tp is not a table", "write [gpu.NAME.tp.N]")
    for size, args in per_tp.items():
        if not (size.isascii() and size.isdigit() and str(int(size)) == size):
            raise ProfileError(f"[gpu.{name}.tp.{size}]: {size!r} is not written as a TP "
                               "size", f"write [gpu.{name}.tp.N] with N as in tp_sizes "
                               "(4, not 04)")
        if int(size) not in sizes:
            raise ProfileError(f"[gpu.{name}.tp.{size}]: not one of tp_sizes {sizes}",
                               "add the size to tp_sizes or drop the table")
        check_args(f"[gpu.{name}.tp.{size}]", args)


def check_table(table: dict[str, Any], *, target: str | None = None,
                upstream_version: str | None = None) -> None:
    """Refuse a profile (its parsed TOML) that breaks the module docstring's rules.

    Args:
        table: the profile.
        target: the target it must be for (its ``target``, when it names one, must be
            this), or None.
        upstream_version: the SGLang release it must be for, or None.

    Raises:
        ProfileError: what is wrong, with a hint.
    """
    unknown = set(table) - set(TOP_KEYS)
    if unknown:
        raise ProfileError(f"unknown keys {sorted(unknown)}",
                           "only target, upstream_version, [args] and [gpu.*]")
    named = table.get("target")
    if named is not None and not isinstance(named, str):
        raise ProfileError(f"target = {named!r} is not a string", 'write target = "NAME"')
    if target is not None and named is not None and named != target:
        raise ProfileError(f"the profile is for target {named}, not {target}",
                           "use the profile written for this target")
    if upstream_version is not None and "upstream_version" not in table:
        raise ProfileError("no upstream_version (the release it was written for)",
                           f'write upstream_version = "{upstream_version}" after checking '
                           "the profile against that release")
    if upstream_version is not None and table.get("upstream_version") != upstream_version:
        raise ProfileError(f"the profile is for sglang {table.get('upstream_version')!r}, "
                           f"not {upstream_version}",
                           "use the profile written for this release")
    if not isinstance(table.get("args"), dict):
        raise ProfileError("no [args] table", "add [args] (it may be empty)")
    check_args("[args]", table["args"])
    gpus = table.get("gpu", {})
    if not isinstance(gpus, dict):
        raise ProfileError("gpu is not a table", "write [gpu.<name>] tables")
    for name, entry in gpus.items():
        check_gpu(name, entry)


def resolve_args(table: dict[str, Any], gpu: str | None, tp: int | None) -> dict[str, Any]:
    """The profile's arguments for ``gpu`` at TP ``tp``: the common [args], then
    [gpu.<gpu>.args], then [gpu.<gpu>.tp.<tp>] (later tables win), then ``--tp-size``.

    ``gpu`` None: the common [args] only. ``table`` passed :func:`check_table`.

    Raises:
        ProfileError: an unknown GPU or TP size.
    """
    args = dict(table.get("args", {}))
    if gpu is None:
        return args
    gpus = table.get("gpu", {})
    if gpu not in gpus:
        known = ", ".join(sorted(gpus)) or "none"
        raise ProfileError(f"the launch profile has no GPU {gpu!r} (it has: {known})")
    entry = gpus[gpu]
    sizes = entry.get("tp_sizes", [])
    if tp not in sizes:
        raise ProfileError(f"the launch profile's {gpu} entry has no TP size {tp} (it has: "
                           f"{', '.join(map(str, sizes))})")
    args.update(entry.get("args", {}))
    args.update(entry.get("tp", {}).get(str(tp), {}))
    args[TP_OPTION] = tp
    return args


def fit_graph_bounds(args: dict[str, Any], argv: list[str]) -> list[str]:
    """Lower the profile's CUDA graph bounds in ``args`` (in place) to the request cap the
    user's ``argv`` gives, where the user gives no bound of their own.

    A graph captured for a batch above ``--max-running-requests`` is never replayed (the
    scheduler never forms that batch) and its memory comes out of the KV pool; SGLang lowers
    only its own default bound to the cap (0.5.23 ``handle_gpu_memory_settings``), not one
    given on the command line, which a profile's is.

    Args:
        args: the profile's resolved arguments (:func:`resolve_args`).
        argv: the user's server arguments.

    Returns:
        one line per bound lowered, saying from what to what and why (empty: none; also
        when the cap is not a whole number, which SGLang's parser then refuses).
    """
    cap = None
    for index, arg in enumerate(argv):
        option = option_of(arg)
        if option is None or len(option) < len("--max-running") or \
                not MAX_RUNNING.startswith(option):
            continue
        text = arg.split("=", 1)[1] if "=" in arg else \
            (argv[index + 1] if index + 1 < len(argv) else "")
        try:
            cap = int(text)
        except ValueError:  # SGLang's own parser refuses it, with its own words
            cap = None
    given = given_options(argv)
    notes = []
    for bound in GRAPH_BOUNDS:
        value = args.get(bound)
        if cap is None or bound in given or isinstance(value, bool) or \
                not isinstance(value, int) or value <= cap:
            continue
        args[bound] = cap
        notes.append(f"the profile's {bound} {value} lowered to {cap}, your "
                     f"{MAX_RUNNING} (a graph above the request cap is never used)")
    return notes


def to_argv(args: dict[str, Any], given: set[str]) -> list[str]:
    """``args`` as argv, leaving out every option in ``given`` and every ``false``."""
    argv: list[str] = []
    for option, value in args.items():
        if option in given or value is False:
            continue
        if value is True:
            argv.append(option)
        elif isinstance(value, list):
            argv += [option, *(str(item) for item in value)]
        else:
            argv += [option, str(value)]
    return argv
