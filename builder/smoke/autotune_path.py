"""Where a release's server keeps FlashInfer's autotune file: SGLang's own key, computed.

SGLang 0.5.16 to 0.5.23 read and write the file at ``$SGLANG_CACHE_DIR/flashinfer/autotune/
<FlashInfer version>/sm<cc>/<key>/rank_tp<r>_pp<r>_dp<r>.json``, where ``<key>`` is the
first 16 hex digits of a sha256 over the model path, dtype, quantization, MoE runner
backend, TP/PP/attention-DP/EP sizes and the HF config class (0.5.20 adds the skipped
ops, 0.5.23 a candidate-selection tag): ``flashinfer_autotune_cache_path`` in
``sglang/srt/model_executor/runner/flashinfer_autotune.py`` of each release. The builder
does not copy that formula: it runs the release's own function, in the release's behaviour
environment (CPU torch, the device reported as the key's compute capability by
``sm120_device``), over the patched code of the target's series (patch 0002 changes the
resolved MoE backend on SM12x, which is in the key), with the server arguments parsed and
resolved by the release's own ``prepare_server_args``
(``builder/behaviour/script/autotune_path.py``).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final

from builder.core.errors import BuildError, ConfigurationError

if TYPE_CHECKING:
    from builder.behaviour.env import BehaviourEnv
    from builder.core.options import Options

SCRIPT: Final = (Path(__file__).resolve().parents[1] / "behaviour" / "script"
                 / "autotune_path.py")
_PREFIX: Final = "PATHS "
#: A Hugging Face model name, ``owner/name`` or a legacy bare ``name`` such as ``gpt2``
#: (``huggingface_hub``'s repo-id characters).
HF_NAME: Final = re.compile(r"(?:[A-Za-z0-9_](?:[A-Za-z0-9_.-]{0,94}[A-Za-z0-9_])?/)?"
                            r"[A-Za-z0-9_](?:[A-Za-z0-9_.-]{0,94}[A-Za-z0-9_])?")


@dataclass(frozen=True)
class AutotunePaths:
    """Every rank's autotune file of one server configuration.

    Attributes:
        release: the sglang version whose function computed them.
        paths: one per rank, relative to ``SGLANG_CACHE_DIR``, rank 0 first.
        function: the function that computed them (``module:name``).
    """

    release: str
    paths: tuple[str, ...]
    function: str


def check_model_path(model_path: str) -> None:
    """Refuse a ``--model-path`` that is neither a local folder nor a Hugging Face name.

    SGLang reads a path that does not exist as a Hugging Face name, so a mistyped folder
    failed deep in the release with ``huggingface_hub``'s "Repo id must be in the form
    'repo_name'..."; it is refused here, before the release is fetched or run. A name of
    the form ``owner/name`` (or a legacy bare ``name``) is left to the release, as before.

    Raises:
        ConfigurationError: not a folder (a file, or nothing there), and not of the form
            ``owner/name`` (or a bare ``name``) with nothing of that name here.
    """
    if os.path.isdir(model_path) or (not os.path.lexists(model_path)
                                     and HF_NAME.fullmatch(model_path)):
        return
    what = "a file, not a folder" if os.path.isfile(model_path) else "no such folder"
    raise ConfigurationError(
        f"--model-path {model_path}: {what} (a local checkpoint folder holding "
        "config.json, or a Hugging Face name owner/name, which needs network)",
        "give the path the server starts with")


def run_path_function(env: BehaviourEnv, argvs: list[list[str]], capability: tuple[int, int],
                      *, overlay: Path | None = None) -> list[AutotunePaths]:
    """Run the release's ``flashinfer_autotune_cache_path`` for each argv in ``env``.

    Args:
        env: the release's behaviour environment.
        argvs: server argument lists, as ``python -m sglang.launch_server`` gets them
            (``--model-path`` included: the path as the server will see it is in the key).
        capability: the GPU's compute capability, ``(12, 0)``.
        overlay: the patched tree, put first on ``PYTHONPATH`` (None: the release as
            published).

    Returns:
        One :class:`AutotunePaths` per argv.

    Raises:
        ConfigurationError: the release refuses an argument list (its own message), or they
            ask for data parallelism (its ranks are not computed here).
        BuildError: the script printed no answer (the release did not import).
    """
    environ = {k: v for k, v in os.environ.items()
               if not k.startswith("PYTHON") and k != "SGLANG_CACHE_DIR"}
    environ["SM120_CAPABILITY"] = f"{capability[0]}.{capability[1]}"
    environ["PYTHONDONTWRITEBYTECODE"] = "1"  # the overlay is a cache entry, checked by digest
    if overlay is not None:
        environ["PYTHONPATH"] = str(overlay)
    request = {"argvs": argvs, "standins": env.standins, "device": True}
    done = subprocess.run([str(env.python), str(SCRIPT)], input=json.dumps(request),
                          capture_output=True, text=True, env=environ, check=False,
                          timeout=900)
    found = [json.loads(line[len(_PREFIX):]) for line in done.stdout.splitlines()
             if line.startswith(_PREFIX)]
    if len(found) != len(argvs):
        tail = "\n".join(done.stderr.strip().splitlines()[-12:])
        raise BuildError(f"sglang {env.release}'s autotune path function gave no answer "
                         f"(exit {done.returncode}):\n{tail}",
                         "run builder/behaviour/script/autotune_path.py by hand in the "
                         "behaviour environment to see why")
    for argv, answer in zip(argvs, found, strict=True):
        if not answer["ok"]:
            raise ConfigurationError(f"sglang {env.release} computes no autotune path for "
                                     f"{' '.join(argv)}: {answer['error']}",
                                     "give the arguments the server starts with, or --dest")
    return [AutotunePaths(env.release, tuple(a["paths"]), a["function"]) for a in found]


def release_autotune_paths(options: Options, argv: list[str], capability: tuple[int, int]
                           ) -> AutotunePaths:
    """:func:`run_path_function` on the selected target's patched release.

    The target's pinned wheel and its behaviour environment come from the cache (fetched
    and installed once); the series is applied to the wheel's tree, as the behaviour stage
    does, so the key is the one the built wheel computes.

    Raises:
        ConfigurationError: no such target, it pins no wheel for this interpreter, or the
            release refuses the arguments.
        SourceError: the wheel could not be fetched.
        PatchError: the series does not apply.
        BuildError: the environment could not be installed or the script did not answer.
    """
    from builder.behaviour.env import behaviour_env
    from builder.behaviour.run import wheel_for_interpreter
    from builder.core.options import select_target
    from builder.patching.apply import apply_series
    from builder.patching.series import select_series
    from builder.source.fetch import fetch_pin

    target = select_target(options)
    series = select_series(options, target)
    cache = options.cache
    source = fetch_pin(wheel_for_interpreter(target), target.upstream_version, cache=cache,
                       index_url=options.index_url, reporter=options.reporter)
    assert source.archive is not None  # a wheel pin always has its file
    env = behaviour_env(source.archive, str(target.upstream_version), cache=cache,
                        reporter=options.reporter)
    patched = apply_series(source, series, cache=cache)
    return run_path_function(env, [argv], capability, overlay=patched.tree)[0]
