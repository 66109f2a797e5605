"""A warm autotune cache: FlashInfer's autotune file, captured with the key it is valid for.

Issue 27, part 3 (the CPU side). A GPU smoke run's server writes FlashInfer's autotune
config file; :func:`capture` keeps its fused-MoE entries for one model shape and wraps them
with a :class:`WarmCacheKey` (GPU name and compute capability, FlashInfer version, release,
model shape, TP, dtype). :func:`restore` writes the file back for a server only when the
running key equals the captured one; otherwise it logs one warning and writes nothing.

Why the dtype is in the key: FlashInfer 0.6.14's file keys (``autotune(cache=...)`` in
``flashinfer/autotuner.py``) hold the op name, the runner's class name and the input shapes,
not the runner's hash its in-memory keys carry, so bf16 and fp8 MoE runs of one shape share
keys; on the lent H200 (2026-12-01, ``reports/2026-12-01-h200-moe-shapes/``) an fp8 run
that read a bf16 run's file failed with "Invalid gemm1 profile id". The file's own
``_metadata`` names the GPU and FlashInfer version (checked by :func:`capture`), not the
dtype.
"""

from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Final

from builder.core.cache import atomic_write_bytes, replaceable
from builder.core.errors import ConfigurationError
from builder.core.userfiles import read_json_input

FORMAT: Final = 1
DTYPES: Final = ("bf16", "fp8", "nvfp4")
logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class WarmCacheKey:
    """What an autotune result is valid for; two keys match only when every field is equal.

    Attributes:
        gpu_name: the GPU's name as FlashInfer's ``_metadata.gpu`` and torch report it.
        compute_capability: ``"major.minor"``, e.g. ``"12.0"``.
        flashinfer_version: the FlashInfer release that tuned (its tactic ids are its own).
        release: the target, e.g. ``sglang-0.5.16``.
        hidden: the model's hidden size.
        experts: experts on each GPU.
        top_k: experts per token.
        intermediate: the per-GPU expert width.
        tp: tensor parallelism.
        dtype: one of :data:`DTYPES` (FlashInfer's file does not tell them apart).
    """

    gpu_name: str
    compute_capability: str
    flashinfer_version: str
    release: str
    hidden: int
    experts: int
    top_k: int
    intermediate: int
    tp: int
    dtype: str

    @classmethod
    def from_mapping(cls, data: object) -> WarmCacheKey:
        """Build a key from JSON, checking every field's type.

        Raises:
            ConfigurationError: a field is missing, extra, of the wrong type, or the dtype
                is unknown.
        """
        if not isinstance(data, dict):
            raise ConfigurationError("a warm-cache key must be a JSON object",
                                     "give --key a JSON object of " + ", ".join(
                                         f.name for f in fields(cls)))
        names = {f.name: f.type for f in fields(cls)}
        missing, extra = sorted(names.keys() - data.keys()), sorted(data.keys() - names.keys())
        if missing or extra:
            raise ConfigurationError(f"warm-cache key: missing {missing}, unknown {extra}",
                                     "give exactly: " + ", ".join(names))
        for name, kind in names.items():
            want = int if kind == "int" else str
            value = data[name]
            if type(value) is not want or (isinstance(value, int) and value < 1):
                raise ConfigurationError(f"warm-cache key: {name} must be a "
                                         f"{'positive integer' if want is int else 'string'}, "
                                         f"got {value!r}", "fix that field of the key")
        if data["dtype"] not in DTYPES:
            raise ConfigurationError(f"warm-cache key: dtype {data['dtype']!r} is not one of "
                                     f"{', '.join(DTYPES)}", "the model's torch dtype, "
                                     "as SGLang serves it")
        return cls(**data)

    def mismatches(self, other: WarmCacheKey) -> list[str]:
        """``field: captured X, running Y`` for each field where ``other`` differs."""
        mine, theirs = asdict(self), asdict(other)
        return [f"{name}: captured {mine[name]!r}, running {theirs[name]!r}"
                for name in mine if mine[name] != theirs[name]]


#: The longest entry key parsed, in characters: FlashInfer 0.6.14's fused-MoE keys are about
#: 100 (five shapes of at most three dimensions); a longer key is not one of ours.
KEY_LIMIT: Final = 1024
_TOKEN = re.compile(r"\s*(?:(?P<int>-?[0-9]{1,19})|'(?P<str>[A-Za-z0-9_:.\- ]{0,200})'|"
                    r"(?P<punct>[(),]))")


def _parse_entry_key(text: str) -> tuple[Any, ...] | None:
    """An entry key as a tuple of tuples, ints and plain strings, or None for anything else.

    A strict parser of the one form FlashInfer's file keys take (``repr`` of a tuple of
    strings, ints and tuples), not :func:`ast.literal_eval`: the file is input the builder
    does not trust, and ``literal_eval`` of a hostile key (100,000 ``-`` signs) raises
    ``MemoryError`` from the compiler. Keys longer than :data:`KEY_LIMIT` and nesting deeper
    than 4 are refused, so the work is bounded by the limit.
    """
    if len(text) > KEY_LIMIT:
        return None
    tokens: list[tuple[str, str]] = []
    at = 0
    while at < len(text.rstrip()):
        match = _TOKEN.match(text, at)
        if match is None:
            return None
        kind = match.lastgroup or ""
        tokens.append((kind, match.group(kind)))
        at = match.end()
    parsed, end = _parse_tuple(tokens, 0, depth=0)
    return parsed if parsed is not None and end == len(tokens) else None


def _parse_tuple(tokens: list[tuple[str, str]], at: int, *, depth: int
                 ) -> tuple[tuple[Any, ...] | None, int]:
    """The tuple starting at ``tokens[at]`` and the index after it (None when malformed)."""
    if depth > 4 or at >= len(tokens) or tokens[at] != ("punct", "("):
        return None, at
    items: list[Any] = []
    at += 1
    while at < len(tokens) and tokens[at] != ("punct", ")"):
        kind, value = tokens[at]
        if kind == "int":
            items.append(int(value))
            at += 1
        elif kind == "str":
            items.append(value)
            at += 1
        else:
            inner, at = _parse_tuple(tokens, at, depth=depth + 1)
            if inner is None:
                return None, at
            items.append(inner)
        if at < len(tokens) and tokens[at] == ("punct", ","):
            at += 1
        elif at >= len(tokens) or tokens[at] != ("punct", ")"):
            return None, at
    if at >= len(tokens):
        return None, at
    return tuple(items), at + 1


def _fc1_shape(entry_key: str) -> tuple[int, ...] | None:
    """The fc1 weight shape of one FlashInfer fused-MoE file entry, or None for another op.

    An entry's key is the repr of ``(op, runner class, input shapes, extras)``; the fused
    MoE's second input is fc1's weights ``[experts, 2 * intermediate, hidden]``
    (``autotune(cache=...)`` in FlashInfer 0.6.14's ``flashinfer/autotuner.py``).
    """
    parsed = _parse_entry_key(entry_key)
    if (parsed is None or len(parsed) < 3 or not isinstance(parsed[0], str)
            or not parsed[0].startswith("trtllm::fused_moe::")):
        return None
    shapes = parsed[2]
    if (not isinstance(shapes, tuple) or len(shapes) < 2 or not isinstance(shapes[1], tuple)
            or not all(isinstance(n, int) for n in shapes[1])):
        return None
    return tuple(shapes[1])


def _check_content(data: object, key: WarmCacheKey, where: str, *, every: bool
                   ) -> dict[str, Any]:
    """The ``_metadata`` and fused-MoE entries of ``key``'s shape in a FlashInfer file.

    One check for both directions: ``capture`` keeps the matching entries of a server's file
    (``every=False``), ``restore`` takes an artifact's file only when every entry matches
    (``every=True``: capture never writes another, so one is a hand edit or a mix-up).

    Args:
        data: the parsed file (or the artifact's ``flashinfer_cache``).
        key: what the content must be valid for.
        where: the file, for the messages.
        every: refuse any entry not of the key's shape, rather than dropping it.

    Returns:
        ``{"_metadata": ..., entry: value, ...}`` with at least one entry.

    Raises:
        ConfigurationError: no ``_metadata``, another GPU or FlashInfer, no entry of the
            key's shape, or (``every``) an entry of another op or shape.
    """
    meta = data.get("_metadata") if isinstance(data, dict) else None
    if not isinstance(data, dict) or not isinstance(meta, dict):
        raise ConfigurationError(f"{where} has no _metadata: not a FlashInfer autotune file")
    for field, have in (("gpu", key.gpu_name), ("flashinfer_version", key.flashinfer_version)):
        if meta.get(field) != have:
            raise ConfigurationError(
                f"{where} was written with {field} {meta.get(field)!r}, the key "
                f"says {have!r}", "capture the file on the GPU and FlashInfer the key names")
    want = (key.experts, 2 * key.intermediate, key.hidden)
    entries = {k: v for k, v in data.items() if k != "_metadata" and _fc1_shape(k) == want}
    others = len(data) - 1 - len(entries)
    if every and others:
        raise ConfigurationError(
            f"{where} holds {others} entries not of fused-MoE fc1 weights {list(want)}",
            "restore only what warm-cache capture wrote for this key")
    if not entries:
        raise ConfigurationError(
            f"{where} holds no fused-MoE entry for fc1 weights {list(want)}",
            "check hidden, experts, intermediate (per GPU) and that the autotune ran")
    return {"_metadata": meta, **entries}


def capture(flashinfer_cache: Path, key: WarmCacheKey) -> dict[str, Any]:
    """The warm-cache artifact of ``key``'s shape from FlashInfer's autotune file.

    Keeps the file's ``_metadata`` and its fused-MoE entries whose fc1 weights are
    ``[experts, 2 * intermediate, hidden]`` of ``key``.

    Raises:
        ConfigurationError: the file is unreadable (a named pipe or a folder is refused at
            once, see :func:`read_json_input`) or not FlashInfer's format, was written on
            another GPU or FlashInfer than ``key`` names, or holds no entry for the shape.
    """
    try:
        data = read_json_input(flashinfer_cache, "FlashInfer's autotune file",
                               "pass the file the server wrote")
    except ConfigurationError as exc:
        raise exc.replaced(cause=f"cannot read FlashInfer's autotune file: {exc.cause}"
                           ) from None
    content = _check_content(data, key, str(flashinfer_cache), every=False)
    return {"format": FORMAT, "key": asdict(key), "flashinfer_cache": content}


def refuse_own_input(output: Path, flag: str, inputs: dict[str, Path | None]) -> None:
    """Refuse an output path that names one of the command's own inputs.

    Writing the output would replace the input it is read from (``--output`` equal to
    ``--autotune-file`` turned the server's file into an artifact).

    Args:
        output: the path to be written.
        flag: its flag, for the message.
        inputs: ``{flag: path}`` of the files read (None: not given).

    Raises:
        ConfigurationError: ``output`` is the same file as one of ``inputs`` (by inode
            where both exist, else by resolved path).
    """
    for name, path in inputs.items():
        if path is None:
            continue
        try:
            same = os.path.samefile(output, path)
        except OSError:
            same = output.resolve() == path.resolve()
        if same:
            raise ConfigurationError(f"{flag} {output} is {name} {path}, an input of this "
                                     "command", f"give {flag} another file")


def write_artifact(artifact: dict[str, Any], dest: Path) -> None:
    """Write a :func:`capture` result to ``dest`` whole or not at all."""
    atomic_write_bytes(dest, (json.dumps(artifact, indent=2, sort_keys=True) + "\n").encode())


def restore(artifact_path: Path, running: WarmCacheKey, dest: Path) -> bool:
    """Write the artifact's FlashInfer file to ``dest`` when its key equals ``running``.

    A missing, unreadable or mismatched artifact is ignored with one warning (the server
    then tunes as if there were none); ``dest`` is never written then. A named pipe or a
    folder given as the artifact is one of those unreadable ones, refused without waiting.

    Args:
        artifact_path: the :func:`capture` artifact (``--artifact``).
        running: the key of the server about to start (``--key``).
        dest: the autotune file the server will read (``--dest``).

    Returns:
        True when ``dest`` was written.

    Raises:
        ConfigurationError: ``dest`` is not a file the restore could replace (a folder, a
            link, a pipe or a device: the user's flag, refused whatever the artifact holds).
    """
    replaceable(dest)  # checked first: a bad --dest is the user's, not the artifact's, fault
    try:
        artifact = read_json_input(artifact_path, "the artifact",
                                   "give the file warm-cache capture wrote")
        if not isinstance(artifact, dict) or artifact.get("format") != FORMAT:
            got = artifact.get("format") if isinstance(artifact, dict) else None
            raise ConfigurationError(f"format {got!r}, this builder reads {FORMAT}")
        captured = WarmCacheKey.from_mapping(artifact.get("key"))
        cache = artifact.get("flashinfer_cache")
        if not isinstance(cache, dict):
            raise ConfigurationError("no flashinfer_cache object")
    except (OSError, ValueError, ConfigurationError) as exc:
        logger.warning("warm autotune cache %s ignored: unreadable (%s)", artifact_path, exc)
        return False
    differ = captured.mismatches(running)
    if differ:
        logger.warning("warm autotune cache %s ignored: its key does not match (%s)",
                       artifact_path, "; ".join(differ))
        return False
    try:  # the key field is only a label: the content is checked as capture checks it
        cache = _check_content(cache, running, "its flashinfer_cache", every=True)
    except ConfigurationError as exc:
        logger.warning("warm autotune cache %s ignored: %s", artifact_path, exc.cause)
        return False
    atomic_write_bytes(dest, (json.dumps(cache, indent=2) + "\n").encode())
    return True


def _read_key(path: Path) -> Any:
    """The JSON in the ``--key`` file (its shape is checked by ``WarmCacheKey``).

    Raises:
        ConfigurationError: the file cannot be read (a named pipe or a folder is refused at
            once, never waited on) or is not JSON.
    """
    try:
        return read_json_input(path, "the key file", "give a JSON object of the key's fields")
    except ConfigurationError as exc:
        raise exc.replaced(cause=f"cannot read the key: {exc.cause}") from None


def _autotune_file(cache_dir: Path) -> Path:
    """The one autotune file SGLang wrote under ``cache_dir``.

    SGLang 0.5.16 writes it at ``flashinfer/autotune/<FlashInfer version>/sm<cc>/<model
    hash>/rank_tp<r>_pp<r>_dp<r>.json`` (``flashinfer_autotune_cache_path`` in
    ``sglang/srt/model_executor/runner/flashinfer_autotune.py``).

    Raises:
        ConfigurationError: none or more than one such file.
    """
    files = sorted(cache_dir.glob("flashinfer/autotune/*/*/*/rank_*.json"))
    if len(files) != 1:
        raise ConfigurationError(
            f"{cache_dir} holds {len(files)} SGLang autotune files "
            f"(flashinfer/autotune/*/*/*/rank_*.json), not one: "
            + (", ".join(str(f.relative_to(cache_dir)) for f in files) or "none"),
            "pass the one to keep with --autotune-file")
    return files[0]


def run_warm_cache_capture(key_file: Path, output: Path, *, autotune_file: Path | None = None,
                           sglang_cache_dir: Path | None = None) -> dict[str, Any]:
    """Keep the fused-MoE entries of an autotune file for the key's shape, in one artifact.

    Args:
        key_file: the JSON file of the key (:class:`WarmCacheKey`'s fields).
        output: where the artifact goes.
        autotune_file: FlashInfer's autotune file itself; else
        sglang_cache_dir: SGLang's cache folder holding exactly one such file.

    Returns:
        ``{"action": "capture", "source", "artifact", "entries"}``.

    Raises:
        ConfigurationError: the key cannot be read or is malformed, the folder holds not
            exactly one autotune file, the file is not FlashInfer's for that key, or
            ``output`` is one of the inputs.
    """
    key = WarmCacheKey.from_mapping(_read_key(key_file))
    source = autotune_file or _autotune_file(sglang_cache_dir or Path())
    refuse_own_input(output, "--output", {"--key": key_file, "the autotune file": source})
    artifact = capture(source, key)
    write_artifact(artifact, output)
    return {"action": "capture", "source": str(source), "artifact": str(output),
            "entries": len(artifact["flashinfer_cache"]) - 1}


def run_warm_cache_restore(key_file: Path, artifact: Path, dest: Path) -> dict[str, Any]:
    """Write the artifact's autotune file to ``dest`` only when the key equals the captured
    one (:func:`restore`).

    Args:
        key_file: the JSON file of the running key.
        artifact: the captured artifact.
        dest: the autotune file the server will read.

    Returns:
        ``{"action": "restore", "artifact", "dest", "restored"}``.

    Raises:
        ConfigurationError: the key cannot be read or is malformed, or ``dest`` is not a
            file or is one of the inputs.
    """
    refuse_own_input(dest, "--dest", {"--key": key_file, "--artifact": artifact})
    key = WarmCacheKey.from_mapping(_read_key(key_file))
    written = restore(artifact, key, dest)
    return {"action": "restore", "artifact": str(artifact), "dest": str(dest),
            "restored": written}
