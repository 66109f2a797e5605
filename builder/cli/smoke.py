"""The smoke test's command: ``smoke``."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from builder.cli.common import image_id_from, seconds
from builder.core.errors import ConfigurationError

if TYPE_CHECKING:
    from builder.core.progress import Reporter
    from builder.smoke.gpu import SmokeReport

_SMOKE_EPILOG = """\
checks: runner, sglang, lockstep, kernels, moe-autotune, server, parallel. 1-4 always
count; 5 counts with --moe or when the kernel wheel ships the fused MoE module for this GPU;
6 counts with --model or --tiny-model (host mode) and fails unless SGLang's FlashInfer
autotune profiled tactics; 7 counts with --parallel (TP 1, TP 2 EP 1, TP 2 EP 2 must return
the same tokens; not-run, which fails, where fewer than 2 GPUs are visible). A check that
needs a GPU and finds none fails ("no CUDA device").

examples:
  python -m builder smoke --mode host --sglang-wheel dist/sglang-0.5.9+sm120.1-py3-none-any.whl
  python -m builder smoke --mode host --moe --json --output reports/smoke.json
  python -m builder smoke --mode image --image sglang-sm120:0.5.9
  python -m builder smoke --moe --model /models/small --server-arg=--tp-size=2
  python -m builder smoke --moe --tiny-model --server-arg=--attention-backend=triton
  python -m builder smoke --tiny-model --parallel  # on 2 GPUs
  # where only torch and FlashInfer are installed, run the probe alone, judge it elsewhere:
  cp -rL builder/smoke/script DIR  # the probe and the two files it loads beside it
  python DIR/smoke_probe.py --sglang-pattern 'sglang/srt/model_executor/*.py' > probe.out
  python -m builder smoke --probe-output probe.out --sglang-wheel dist/sglang-….whl

exit status: 0 passed, 1 failed, 2 bad input (a flag, a wheel or report that cannot be
read), 3 misconfigured runner (the engine cannot give a container a GPU: no NVIDIA
runtime, or no driver).
"""


_WARM_EPILOG = """\
KEY is a JSON object with exactly: gpu_name, compute_capability, flashinfer_version,
release, hidden, experts, top_k, intermediate (per GPU), tp, dtype (bf16, fp8, nvfp4).

examples:
  # after a smoke run on the GPU, keep its FlashInfer autotune file for one MoE shape:
  python -m builder warm-cache capture --sglang-cache-dir ~/.cache/sglang --key key.json \\
      --output warm-cache.json
  # before a server start: write it back only when the running key equals the captured one
  python -m builder warm-cache restore --artifact warm-cache.json --key key.json \\
      --dest ~/.cache/sglang/flashinfer/autotune/0.6.14/sm90/HASH/rank_tp0_pp0_dp0.json

exit status: 0 (restore too when the artifact is missing, unreadable or of another key:
one warning, nothing written, so a server start never waits on it; the server then
tunes), 2 bad input (the key, capture's file that is not FlashInfer's for that key, or a
--dest that is not a file).
"""


def add_commands(commands: Any) -> None:
    """Add ``smoke`` and ``warm-cache``."""
    _add_warm_cache(commands)
    smoke = commands.add_parser(
        "smoke", help="smoke-test the artifacts on a GPU runner (JSON report + summary)",
        description="Run the smoke checks in this Python environment (--mode host) or in a "
                    "built image with every GPU attached (--mode image). Runs with "
                    "FLASHINFER_DISABLE_JIT=1: a kernel missing from the kernel wheel fails, "
                    "it is never compiled.",
        epilog=_SMOKE_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    smoke.add_argument("--json", action="store_true",
                       help="print one JSON object on stdout and no progress")
    smoke.add_argument("--mode", choices=("host", "image"), default="host",
                       help="host: this environment; image: a container (default: %(default)s)")
    smoke.add_argument("--image", metavar="REF",
                       help="the image to test (--mode image); @FILE reads the image ID from "
                            "the JSON that `image --json` printed into FILE")
    smoke.add_argument("--python", metavar="PY",
                       help="interpreter of the tested environment (default: this one; in "
                            "an image: python3)")
    which = smoke.add_mutually_exclusive_group()
    which.add_argument("--sglang-wheel", type=Path, metavar="WHEEL",
                       help="the sglang wheel being released: the installed one must be it")
    which.add_argument("--expect-provenance", type=Path, metavar="FILE",
                       help="compare the installed sglang's sm120-provenance.json with this")
    smoke.add_argument("--series", type=Path, default=Path("patches/series.toml"),
                       metavar="FILE", help="series whose intent checks must hold in the "
                                            "installed sglang (default: %(default)s)")
    smoke.add_argument("--moe", action="store_true",
                       help="count check 5 (fused MoE autotune) even when it cannot run")
    served = smoke.add_mutually_exclusive_group()
    served.add_argument("--model", type=Path, metavar="PATH",
                        help="a model folder: also launch SGLang and ask it for text (check 6)")
    served.add_argument("--tiny-model", action="store_true",
                        help="check 6 on a tiny Qwen3-MoE with random weights written by the "
                             "tested Python (torch + safetensors; no download, no tokenizer: "
                             "--skip-tokenizer-init and token ids)")
    smoke.add_argument("--parallel", action="store_true",
                       help="check 7: serve the model (--model or --tiny-model) at TP 1, TP 2 "
                            "EP 1 and TP 2 EP 2 and compare their greedy tokens (needs 2 "
                            "GPUs; host mode)")
    smoke.add_argument("--server-arg", action="append", default=[], metavar="ARG",
                       help="extra argument for sglang.launch_server (repeatable)")
    smoke.add_argument("--probe-output", type=Path, metavar="FILE",
                       help="judge this saved output of builder/smoke/script/smoke_probe.py (run "
                            "by hand where the builder is not installed) instead of running it")
    smoke.add_argument("--timeout", type=seconds, default=3600.0, metavar="SECONDS",
                       help="limit for the probe, checks 1-5 (default: %(default)s)")
    smoke.add_argument("--server-timeout", type=seconds, default=1800.0, metavar="SECONDS",
                       help="limit for the server to become ready (default: %(default)s)")
    smoke.add_argument("--output", type=Path, metavar="FILE",
                       help="also write the JSON report here (written when it fails too)")
    smoke.set_defaults(handler=_cmd_smoke)


def _render_smoke(report: SmokeReport, reporter: Reporter) -> None:
    from rich.table import Table

    table = Table(title=f"Smoke test ({report.mode} mode)")
    for column in ("check", "status", "counted", "detail"):
        table.add_column(column, overflow="fold")
    for check in report.checks:
        table.add_row(check.name, check.status, "yes" if check.required else "no",
                      check.detail)
    reporter.result(table)
    reporter.result(report.summary()[-1], style="bold")


def _cmd_smoke(args: argparse.Namespace, reporter: Reporter) -> dict[str, Any]:
    from builder.smoke.gpu import SmokeFailed, SmokeOptions, run_smoke, write_report

    if args.image and args.image.startswith("@"):
        args.image = image_id_from(Path(args.image[1:]))
    if args.mode == "image" and not args.image:
        raise ConfigurationError("--mode image needs --image REF", "name the image to test")
    if args.mode == "host" and args.image:
        raise ConfigurationError("--image applies with --mode image only",
                                 "add --mode image, or drop --image to test this environment")
    if args.probe_output is not None and args.mode == "image":
        raise ConfigurationError("--probe-output judges a host-mode probe", "drop --mode image")
    report = run_smoke(SmokeOptions(
        mode=args.mode, image=args.image, python=args.python, series=args.series,
        sglang_wheel=args.sglang_wheel, expect_provenance=args.expect_provenance,
        model=args.model, tiny_model=args.tiny_model, moe=args.moe, parallel=args.parallel,
        server_args=tuple(args.server_arg),
        probe_output=args.probe_output, probe_timeout=args.timeout,
        server_timeout=args.server_timeout, reporter=reporter))
    if args.output is not None:
        write_report(report, args.output)
    _render_smoke(report, reporter)
    if not report.passed:
        raise SmokeFailed(report)
    return report.to_json()


def _add_warm_cache(commands: Any) -> None:
    warm = commands.add_parser(
        "warm-cache", help="capture the autotune file a GPU run wrote, keyed, or restore it",
        description="capture: keep the fused-MoE entries of FlashInfer's autotune file (the "
                    "one SGLang's server wrote under --sglang-cache-dir, or --autotune-file) "
                    "for KEY's shape, with KEY, in one JSON artifact. restore: write the "
                    "artifact's file to --dest only when KEY equals the captured key.",
        epilog=_WARM_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    warm.add_argument("action", choices=("capture", "restore"))
    warm.add_argument("--json", action="store_true",
                      help="print one JSON object on stdout and no progress")
    warm.add_argument("--key", type=Path, required=True, metavar="KEY",
                      help="JSON file of the key (see below)")
    found = warm.add_mutually_exclusive_group()
    found.add_argument("--sglang-cache-dir", type=Path, metavar="DIR",
                       help="capture: SGLang's cache folder ($SGLANG_CACHE_DIR) holding "
                            "exactly one flashinfer/autotune/*/*/*/rank_*.json")
    found.add_argument("--autotune-file", type=Path, metavar="FILE",
                       help="capture: FlashInfer's autotune file itself")
    warm.add_argument("--output", type=Path, metavar="FILE", help="capture: the artifact")
    warm.add_argument("--artifact", type=Path, metavar="FILE", help="restore: the artifact")
    warm.add_argument("--dest", type=Path, metavar="FILE",
                      help="restore: the autotune file the server will read")
    warm.set_defaults(handler=_cmd_warm_cache)


def _read_key(path: Path) -> Any:
    """The JSON in the ``--key`` file (its shape is checked by ``WarmCacheKey``).

    Raises:
        ConfigurationError: the file cannot be read (a named pipe or a folder is refused at
            once, never waited on) or is not JSON.
    """
    from builder.core.userfiles import read_json_input

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


def _cmd_warm_cache(args: argparse.Namespace, reporter: Reporter) -> dict[str, Any]:
    from builder.smoke.warm_cache import WarmCacheKey, capture, restore, write_artifact

    key = WarmCacheKey.from_mapping(_read_key(args.key))
    if args.action == "capture":
        if args.output is None or (args.sglang_cache_dir is None and args.autotune_file is None):
            raise ConfigurationError("warm-cache capture needs --output and --sglang-cache-dir "
                                     "or --autotune-file", "see the examples in "
                                     "`python -m builder warm-cache --help`")
        source = args.autotune_file or _autotune_file(args.sglang_cache_dir)
        artifact = capture(source, key)
        write_artifact(artifact, args.output)
        entries = len(artifact["flashinfer_cache"]) - 1
        reporter.result(f"captured {entries} autotune entries from {source} into {args.output}")
        return {"action": "capture", "source": str(source), "artifact": str(args.output),
                "entries": entries}
    if args.artifact is None or args.dest is None:
        raise ConfigurationError("warm-cache restore needs --artifact and --dest",
                                 "see the examples in `python -m builder warm-cache --help`")
    written = restore(args.artifact, key, args.dest)
    reporter.result(f"restored {args.artifact} to {args.dest}" if written
                    else f"not restored: {args.dest} left as it was")
    return {"action": "restore", "artifact": str(args.artifact), "dest": str(args.dest),
            "restored": written}
