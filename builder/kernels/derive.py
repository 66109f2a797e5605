"""The kernels a server will load, derived from the model and the server flags.

Three parts:

* :data:`TABLE` (:mod:`builder.kernels.coverage`, the one owner, shared with the image's
  launcher): the mapping from what the release selects (MoE runner and its dtypes, FP4/FP8
  GEMM backends, attention backend with its head dims and dtypes, sampling backend) to the
  FlashInfer module groups the builder compiles, each row naming the FlashInfer function
  that builds the module.
* :func:`select_backends`: the release's own selection for a checkpoint folder and server
  flags (``behaviour/script/select_backends.py`` in the target's behaviour environment, on
  the patched code, the device reported as SM120), and :func:`derive`, which turns it into
  module groups, head dims and the variants inside the groups (:class:`Derived`).
* :func:`missing_from` and :func:`require_coverage`: what a kernel wheel's manifest lacks
  for a derived set (a module group, a head dim, an arch, or a dtype pair its pruned fused
  MoE module left out: :mod:`builder.kernels.prune`), refused in one message that names
  the ``kernels`` command building it (the launcher refuses with the same words:
  :func:`builder.kernels.coverage.refusal`).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

from builder.core.arch import SM120
from builder.core.errors import BuildError, ConfigurationError
from builder.core.userfiles import parse_json
from builder.kernels import coverage
from builder.kernels.coverage import (
    ATTENTION_DTYPES,
    CHECKED_IN,
    TABLE,
    CoverageError,
    Derived,
    ModuleRow,
    Need,
    build_command,
    covered_by,
    has_fp4_linears,
    missing_from,
    moe_variants_of,
)

__all__ = ["ATTENTION_DTYPES", "CHECKED_IN", "TABLE", "Derived", "ModuleRow", "Need",
           "build_command", "covered_by", "derive", "has_fp4_linears", "installed_manifest",
           "missing_from", "moe_variants_of", "read_model", "require_coverage", "run_select",
           "select_backends"]

_SCRIPTS = Path(__file__).resolve().parent.parent / "behaviour" / "script"
SCRIPT = _SCRIPTS / "select_backends.py"
_PREFIX = "SELECTED "


def derive(selection: dict[str, Any], arch_list: tuple[str, ...]) -> Derived:
    """The module groups, head dims and variants a selection loads
    (:func:`builder.kernels.coverage.derive`, :data:`TABLE`).

    Args:
        selection: :func:`select_backends`'s answer for one configuration.
        arch_list: the build's archs (the per-arch groups are named after the first).

    Returns:
        the :class:`Derived` set.

    Raises:
        ConfigurationError: the release refused the configuration at start-up (the server
            would not start: nothing to build for it), or no arch is given.
    """
    try:
        return coverage.derive(selection, arch_list)
    except CoverageError as error:
        raise ConfigurationError(str(error), error.hint) from None


def run_select(env: Any, cases: list[tuple[Path, tuple[str, ...]]],
               overlay: Path | None) -> list[dict[str, Any]]:
    """Run ``select_backends.py`` in the release's environment, one answer per case.

    Args:
        env: the release's behaviour environment.
        cases: (checkpoint folder, server flags after ``--model-path``) each; the script
            parses the flags with the release's own parser.
        overlay: the patched tree, first on the path (``None``: upstream's code).

    Raises:
        ConfigurationError: the release's parser refuses a case's flags.
        BuildError: the script printed no answer for a case (it crashed).
    """
    request = {"cases": [{"id": str(i), "model_dir": str(m), "argv": list(f)}
                         for i, (m, f) in enumerate(cases)], "standins": env.standins}
    environ = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    environ["SM120_CAPABILITY"] = SM120
    environ["PYTHONDONTWRITEBYTECODE"] = "1"  # the overlay is a cache entry
    if overlay is not None:
        environ["PYTHONPATH"] = str(overlay)
    done = subprocess.run([str(env.python), str(SCRIPT)], input=json.dumps(request),
                          capture_output=True, text=True, env=environ, check=False,
                          timeout=3600)
    found: dict[str, dict[str, Any]] = {}
    for line in done.stdout.splitlines():
        if line.startswith(_PREFIX):
            record = json.loads(line[len(_PREFIX):])
            found[record["id"]] = record.get("observed") or {
                "refused": record.get("error", "no result")}
    if len(found) != len(cases):
        tail = "\n".join(done.stderr.strip().splitlines()[-15:])
        raise BuildError(f"the backend selection printed {len(found)} of {len(cases)} "
                         f"answers (exit {done.returncode}):\n{tail}",
                         "run builder/behaviour/script/select_backends.py by hand in the "
                         "behaviour environment to see why")
    answers = []
    for index, (model, _flags) in enumerate(cases):
        answer = found[str(index)]
        if "flags_refused" in answer:
            raise ConfigurationError(f"sglang {env.release}'s own argument parser refuses "
                                     f"the server flags: {answer['flags_refused']}",
                                     "drop or fix the argument it names")
        answer.update(coverage.checkpoint_facts(*_read_quant(model)))
        answers.append(answer)
    return answers


def _read_quant(model: Path) -> tuple[dict[str, Any], dict[str, Any] | None]:
    config = parse_json((model / "config.json").read_bytes())
    quant = model / "hf_quant_config.json"
    return config, parse_json(quant.read_bytes()) if quant.exists() else None


def read_model(model: Path) -> Path:
    """The checkpoint folder (a ``config.json`` given: its folder), its JSON files read.

    Both files are read here, before the release's selection runs on them, so that a
    file that is not one JSON object is the user's input error, not a crash later.

    Raises:
        ConfigurationError: no ``config.json`` there, or ``config.json`` or
            ``hf_quant_config.json`` is not UTF-8 JSON holding one object (a key named
            twice included).
    """
    folder = model.parent if model.name == "config.json" else model
    if not (folder / "config.json").is_file():
        raise ConfigurationError(f"{model} has no config.json",
                                 "give the checkpoint folder (config.json, and "
                                 "hf_quant_config.json where the checkpoint has one)")
    for name in ("config.json", "hf_quant_config.json"):
        path = folder / name
        if name != "config.json" and not path.exists():
            continue
        if not path.is_file():  # a fifo would block the read
            raise ConfigurationError(f"{path} is not a file", f"give {name} as a file")
        try:
            data = parse_json(path.read_bytes())
        except (OSError, ValueError) as error:  # JSON, UTF-8 and duplicate-key errors
            raise ConfigurationError(f"{path} is not a checkpoint's JSON: {error}",
                                     f"fix or replace {name} (the checkpoint's own file)"
                                     ) from error
        if not isinstance(data, dict):
            raise ConfigurationError(f"{path} holds a {type(data).__name__}, not a JSON "
                                     "object", f"fix or replace {name}")
    return folder


def select_backends(options: Any, target: Any, model: Path, flags: tuple[str, ...]
                    ) -> dict[str, Any]:
    """The target's own selection for ``model`` and ``flags``, on its patched code.

    The release's pinned wheel is fetched, the series applied (the patch stage) and the
    behaviour environment found or installed (``builder.behaviour.env.behaviour_env``;
    the first run installs the release on a CPU torch, minutes).

    Raises:
        ConfigurationError: no ``config.json``, the target pins no wheel for this Python, or
            the release's parser refuses the flags.
        BuildError: the environment could not be installed or the selection crashed.
    """
    from builder.behaviour.env import behaviour_env
    from builder.behaviour.run import wheel_for_interpreter
    from builder.patching.apply import apply_series, read_series
    from builder.patching.series import select_series
    from builder.source.fetch import fetch_pin

    folder = read_model(model)
    series = select_series(options, target)
    read_series(series)
    pin = wheel_for_interpreter(target)
    source = fetch_pin(pin, target.upstream_version, cache=options.cache,
                       index_url=options.index_url, reporter=options.reporter)
    assert source.archive is not None  # a wheel pin always has its file
    patched = apply_series(source, series, cache=options.cache)
    env = behaviour_env(source.archive, str(target.upstream_version), cache=options.cache,
                        reporter=options.reporter)
    with options.reporter.working(f"sglang {target.upstream_version}'s backend selection "
                                  f"for {folder.name}"):
        return run_select(env, [(folder, flags)], patched.tree)[0]


def require_coverage(manifest: dict[str, Any], derived: Derived, *, arch_list: tuple[str, ...],
                     flashinfer: str | None, target: str, model: Path,
                     flags: tuple[str, ...], wheel: str) -> None:
    """Refuse a kernel wheel that does not cover the configuration about to start.

    Raises:
        ConfigurationError: one message naming every missing module group, head dim, arch
            or FlashInfer version, with the ``kernels`` command that builds the set (exit 2).
    """
    missing = missing_from(manifest, derived, arch_list, flashinfer)
    if missing:
        message, hint = coverage.refusal(missing, wheel=wheel, model=model, target=target,
                                         flags=flags)
        raise ConfigurationError(message, hint)


def installed_manifest() -> tuple[str, dict[str, Any]] | None:
    """What the kernel wheels installed in this Python cover, with their distributions'
    names and versions; ``None`` when none is.

    Several (FlashInfer 0.7's provider wheels, one per arch) are combined as the image's
    launcher combines them (:func:`builder.kernels.coverage.combined`), so that
    ``serve-command --check`` and the launcher judge the same installed set.
    """
    found = [(label, parse_json(path.read_bytes()))
             for label, path in coverage.manifest_files()]
    if not found:
        return None
    return ", ".join(label for label, _ in found), coverage.combined([m for _, m in found])
