"""A warm autotune cache: FlashInfer's autotune file, captured with the key it is valid for.

Issue 27, part 3 and issue 37 (the CPU side). A GPU run's server writes FlashInfer's
autotune file, one per rank, where SGLang's own key puts it
(:mod:`builder.smoke.autotune_path`); :func:`capture_ranks` keeps every rank's fused-MoE
entries for one model shape and wraps them with a :class:`WarmCacheKey` (GPU name and
compute capability, FlashInfer version, release, model shape, TP, dtype). :func:`restore`
writes every rank back for a server only when the running key equals the captured one and
the content is what capture would keep (issue 38, class B: the key field alone is a label);
otherwise it logs one warning and writes nothing.

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
from typing import TYPE_CHECKING, Any, Final

from builder.core.cache import atomic_write_bytes, replaceable
from builder.core.errors import ConfigurationError
from builder.core.userfiles import read_json_input

if TYPE_CHECKING:
    from builder.smoke.autotune_path import AutotunePaths

FORMAT: Final = 2
#: A rank's file name as SGLang 0.5.16 to 0.5.23 write it (``rank_tp<r>_pp<r>_dp<r>``;
#: 0.5.23's MegaMoE ``_gpu<uuid>`` files are per physical GPU and not kept).
RANK: Final = re.compile(r"rank_tp([0-9]{1,4})_pp([0-9]{1,4})_dp([0-9]{1,4})")
#: The folder SGLang's key names, under ``SGLANG_CACHE_DIR``.
FOLDER: Final = re.compile(r"flashinfer/autotune/[0-9A-Za-z.+_-]{1,40}/sm[0-9]{2,3}/[0-9a-f]{16}")
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
        if not re.fullmatch(r"[0-9]{1,2}\.[0-9]{1,2}", data["compute_capability"]):
            raise ConfigurationError(f"warm-cache key: compute_capability "
                                     f"{data['compute_capability']!r} is not major.minor",
                                     "e.g. \"12.0\", as torch.cuda.get_device_capability says")
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
    """The artifact of one autotune file (:func:`capture_ranks`); the rank is the file's
    name when it is one (``rank_tp1_pp0_dp0.json``), else rank 0."""
    name = flashinfer_cache.stem if RANK.fullmatch(flashinfer_cache.stem) else "rank_tp0_pp0_dp0"
    return capture_ranks({name: flashinfer_cache}, key, None)


def capture_ranks(files: dict[str, Path], key: WarmCacheKey, folder: str | None
                  ) -> dict[str, Any]:
    """The warm-cache artifact of ``key``'s shape from every rank's autotune file.

    Keeps each file's ``_metadata`` and its fused-MoE entries whose fc1 weights are
    ``[experts, 2 * intermediate, hidden]`` of ``key``.

    Args:
        files: rank name (``rank_tp0_pp0_dp0``) -> that rank's file.
        key: what the content is captured for.
        folder: where the server kept them, relative to ``SGLANG_CACHE_DIR`` (SGLang's own
            key: the image's launcher restores there), or None when not known.

    Returns:
        ``{"format", "key", "folder", "ranks": {rank: file content}}``.

    Raises:
        ConfigurationError: a file is unreadable (a named pipe or a folder is refused at
            once, see :func:`read_json_input`) or not FlashInfer's format, was written on
            another GPU or FlashInfer than ``key`` names, or holds no entry for the shape;
            or a rank is outside the key's TP size.
    """
    ranks = {}
    for name, path in sorted(files.items()):
        _check_rank(name, key)
        try:
            data = read_json_input(path, "FlashInfer's autotune file",
                                   "pass the file the server wrote")
        except ConfigurationError as exc:
            raise exc.replaced(cause=f"cannot read FlashInfer's autotune file: {exc.cause}"
                               ) from None
        ranks[name] = _check_content(data, key, str(path), every=False)
    return {"format": FORMAT, "key": asdict(key), "folder": folder, "ranks": ranks}


def _check_rank(name: str, key: WarmCacheKey) -> None:
    """Refuse a rank name that is not SGLang's or whose TP rank the key's TP cannot have."""
    match = RANK.fullmatch(name)
    if match is None or int(match.group(1)) >= key.tp:
        raise ConfigurationError(f"rank {name!r} is not a rank of a TP {key.tp} server",
                                 "capture the files of the run the key describes")


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
    """Write a :func:`capture_ranks` result to ``dest`` whole or not at all."""
    atomic_write_bytes(dest, (json.dumps(artifact, indent=2, sort_keys=True) + "\n").encode())


def read_artifact(artifact_path: Path, running: WarmCacheKey) -> dict[str, dict[str, Any]]:
    """The artifact's ranks, each checked as capture checks a file, for ``running``.

    Raises:
        ConfigurationError: unreadable, another format, a malformed or other key (the
            mismatches named), a rank name that is not SGLang's, or content capture would
            not keep.
    """
    try:
        artifact = read_json_input(artifact_path, "the artifact",
                                   "give the file warm-cache capture wrote")
    except ConfigurationError as exc:
        raise ConfigurationError(f"unreadable: {exc.cause}") from None
    if not isinstance(artifact, dict) or artifact.get("format") != FORMAT:
        got = artifact.get("format") if isinstance(artifact, dict) else None
        raise ConfigurationError(f"unreadable: format {got!r}, this builder reads {FORMAT}")
    unknown = sorted(artifact.keys() - {"format", "key", "folder", "ranks"})
    if unknown:  # capture writes exactly these: anything else is an edit or a mix-up
        raise ConfigurationError(f"unreadable: fields capture never writes: {unknown}")
    try:
        captured = WarmCacheKey.from_mapping(artifact.get("key"))
    except ConfigurationError as exc:
        raise ConfigurationError(f"unreadable: {exc.cause}") from None
    ranks = artifact.get("ranks")
    if not isinstance(ranks, dict) or not ranks:
        raise ConfigurationError("unreadable: no ranks object")
    folder = artifact.get("folder")
    if folder is not None and (not isinstance(folder, str) or not FOLDER.fullmatch(folder)):
        raise ConfigurationError(f"unreadable: folder {folder!r} is not one SGLang's key "
                                 "names (flashinfer/autotune/<version>/sm<cc>/<16 hex>)")
    differ = captured.mismatches(running)
    if differ:
        raise ConfigurationError(f"its key does not match ({'; '.join(differ)})")
    # the key field is only a label: the content is checked as capture checks it
    for name, content in ranks.items():
        _check_rank(name, running)
        _check_content(content, running, f"its rank {name}", every=True)
    return ranks


def restore(artifact_path: Path, running: WarmCacheKey, dest: Path | dict[str, Path]
            ) -> bool:
    """Write the artifact's autotune files for a server whose key equals the captured one.

    A missing, unreadable or mismatched artifact is ignored with one warning (the server
    then tunes as if there were none); nothing is written then. A named pipe or a folder
    given as the artifact is one of those unreadable ones, refused without waiting. The
    ranks are all written or none: SGLang 0.5.23 drops every rank's file when they
    disagree (``_drop_diverged_autotune_cache``), so a partial restore is no restore.

    Args:
        artifact_path: the :func:`capture_ranks` artifact (``--artifact``).
        running: the key of the server about to start (``--key``).
        dest: every rank of that server -> its file (from SGLang's own key,
            :mod:`builder.smoke.autotune_path`); or one file (``--dest``), given the
            artifact's only rank or the rank of the file's name.

    Returns:
        True when the files were written.

    Raises:
        ConfigurationError: a destination is not a file the restore could replace (a
            folder, a link, a pipe or a device: the user's flag, refused whatever the
            artifact holds).
    """
    dests = dest if isinstance(dest, dict) else {dest.stem: dest}
    for path in dests.values():  # checked first: a bad --dest is the user's fault
        replaceable(path)
    try:
        ranks = read_artifact(artifact_path, running)
    except ConfigurationError as exc:
        logger.warning("warm autotune cache %s ignored: %s", artifact_path, exc.cause)
        return False
    if not isinstance(dest, dict):
        name = dest.stem if dest.stem in ranks else next(iter(ranks))
        if len(ranks) > 1 and dest.stem not in ranks:
            logger.warning("warm autotune cache %s ignored: it holds %d ranks and --dest "
                           "names none of them (give the model and flags instead)",
                           artifact_path, len(ranks))
            return False
        dests = {name: dest}
    missing = sorted(dests.keys() - ranks.keys())
    if missing:
        logger.warning("warm autotune cache %s ignored: the server runs ranks it does not "
                       "hold (%s; it holds %s)", artifact_path, ", ".join(missing),
                       ", ".join(sorted(ranks)))
        return False
    for name, path in dests.items():
        atomic_write_bytes(path, (json.dumps(ranks[name], indent=2) + "\n").encode())
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


def _autotune_files(cache_dir: Path) -> tuple[str, dict[str, Path]]:
    """Every rank's autotune file SGLang wrote under ``cache_dir``, and their folder.

    SGLang 0.5.16 to 0.5.23 write them at ``flashinfer/autotune/<FlashInfer version>/sm<cc>/
    <key>/rank_tp<r>_pp<r>_dp<r>.json`` (``flashinfer_autotune_cache_path`` in
    ``sglang/srt/model_executor/runner/flashinfer_autotune.py``).

    Raises:
        ConfigurationError: no such file, or files of more than one server configuration.
    """
    found = sorted(p for p in cache_dir.glob("flashinfer/autotune/*/*/*/rank_*.json")
                   if RANK.fullmatch(p.stem))
    folders = sorted({str(p.parent.relative_to(cache_dir)) for p in found})
    if len(folders) != 1:
        raise ConfigurationError(
            f"{cache_dir} holds SGLang autotune files of {len(folders)} server "
            f"configurations (flashinfer/autotune/*/*/*/rank_*.json), not one: "
            + (", ".join(folders) or "none"),
            "pass the one to keep with --autotune-file, or a cache of one run")
    return folders[0], {p.stem: p for p in found}


def run_warm_cache_capture(key_file: Path, output: Path, *, autotune_file: Path | None = None,
                           sglang_cache_dir: Path | None = None) -> dict[str, Any]:
    """Keep the fused-MoE entries of every rank's autotune file for the key's shape.

    Args:
        key_file: the JSON file of the key (:class:`WarmCacheKey`'s fields).
        output: where the artifact goes.
        autotune_file: one of FlashInfer's autotune files itself; else
        sglang_cache_dir: SGLang's cache folder holding one run's files (every rank).

    Returns:
        ``{"action": "capture", "source", "artifact", "ranks", "entries"}``.

    Raises:
        ConfigurationError: the key cannot be read or is malformed, the folder holds not
            exactly one run's files, a file is not FlashInfer's for that key, or
            ``output`` is one of the inputs.
    """
    key = WarmCacheKey.from_mapping(_read_key(key_file))
    if autotune_file is not None:
        refuse_own_input(output, "--output", {"--key": key_file,
                                              "the autotune file": autotune_file})
        artifact, source = capture(autotune_file, key), str(autotune_file)
    else:
        root = sglang_cache_dir or Path()
        folder, files = _autotune_files(root)
        for path in files.values():
            refuse_own_input(output, "--output", {"--key": key_file, "the autotune file": path})
        artifact, source = capture_ranks(files, key, folder), str(root / folder)
    write_artifact(artifact, output)
    return {"action": "capture", "source": source, "artifact": str(output),
            "ranks": sorted(artifact["ranks"]),
            "entries": sum(len(c) - 1 for c in artifact["ranks"].values())}


def default_sglang_cache_dir() -> Path:
    """``$SGLANG_CACHE_DIR``, else ``~/.cache/sglang``: SGLang's own default
    (``envs.SGLANG_CACHE_DIR`` in ``sglang/srt/environ.py``, 0.5.16 to 0.5.23)."""
    return Path(os.path.expanduser(os.environ.get("SGLANG_CACHE_DIR") or "~/.cache/sglang"))


def run_warm_cache_restore(key_file: Path, artifact: Path, dest: Path | None = None, *,
                           paths: AutotunePaths | None = None,
                           sglang_cache_dir: Path | None = None) -> dict[str, Any]:
    """Write the artifact's files where the server will read them, only when the key equals
    the captured one and the content is capture's (:func:`restore`).

    Args:
        key_file: the JSON file of the running key.
        artifact: the captured artifact.
        dest: one autotune file (``--dest``); else
        paths: every rank's file by SGLang's own key (:mod:`builder.smoke.autotune_path`),
            under ``sglang_cache_dir`` (default :func:`default_sglang_cache_dir`).
        sglang_cache_dir: the server's ``SGLANG_CACHE_DIR``.

    Returns:
        ``{"action": "restore", "artifact", "dest", "restored"}`` (``dest``: the files).

    Raises:
        ConfigurationError: the key cannot be read or is malformed, neither ``dest`` nor
            ``paths`` is given, the paths name another FlashInfer or another number of
            TP ranks than the key, or a destination is not a file or is one of the inputs.
    """
    key = WarmCacheKey.from_mapping(_read_key(key_file))
    if dest is not None:
        dests: dict[str, Path] | Path = dest
        written = [dest]
    elif paths is not None:
        root = sglang_cache_dir or default_sglang_cache_dir()
        versions = {Path(p).parts[2] for p in paths.paths}
        if versions != {key.flashinfer_version}:
            raise ConfigurationError(
                f"sglang {paths.release} runs FlashInfer {', '.join(sorted(versions))}, the "
                f"key says {key.flashinfer_version}", "fix the key's flashinfer_version")
        tps = {int(m.group(1)) for m in (RANK.fullmatch(Path(p).stem) for p in paths.paths)
               if m}
        if len(tps) != key.tp:  # a TP 2 rank 0 file in a TP 1 server's folder is no restore
            raise ConfigurationError(
                f"sglang {paths.release} runs {len(tps)} TP rank(s) for --model-path and "
                f"the flags after -- (TP {len(tps)}), the key says tp {key.tp}",
                f"give the server's TP size after -- (-- --tp-size {key.tp}), or restore "
                f"an artifact captured at TP {len(tps)}")
        dests = {Path(p).stem: root / p for p in paths.paths}
        written = list(dests.values())
    else:
        raise ConfigurationError("nothing says where the server reads its autotune file",
                                 "give --model-path (and the server's flags) or --dest")
    for path in written:
        refuse_own_input(path, "--dest", {"--key": key_file, "--artifact": artifact})
    done = restore(artifact, key, dests)
    return {"action": "restore", "artifact": str(artifact),
            "dest": [str(p) for p in written], "restored": done}
