"""Smoke stage: the checks an artifact passes on a GPU runner before it is published.

Two modes run the same checks. ``host`` tests the current Python environment (the patched
sglang wheel, FlashInfer and our ``flashinfer_jit_cache`` kernel wheel installed); ``image``
runs the same probe inside a built image with every GPU attached. The GPU-side work happens
in ``builder/smoke/script/`` (:data:`SCRIPT_DIR`), run by path as a separate process with
the tested interpreter (so a CUDA fault cannot take the report with it); this module never
imports it, it reads its output (:class:`~builder.smoke.shared.ProbeResults`), judges it,
runs the server check, and writes the report.

One module per part: :mod:`~builder.smoke.gpu.probe` runs the probe and reads its output,
:mod:`~builder.smoke.gpu.sglang_check` judges check 2, :mod:`~builder.smoke.gpu.lockstep`
check 3, :mod:`~builder.smoke.gpu.serving` runs checks 6 and 7,
:mod:`~builder.smoke.gpu.run` runs them all and assembles the
:mod:`~builder.smoke.gpu.report`; :mod:`~builder.smoke.gpu.options` says what to test.

Checks, in order (``name``: what passes):

1. ``runner``: a CUDA device is visible; its name, compute capability, driver, CUDA runtime
   and shared memory per block (opt-in) are recorded.
2. ``sglang``: the installed sglang carries our provenance, its files equal its RECORD,
   the provenance equals the artifact's (``--sglang-wheel`` / ``--expect-provenance``), and
   every intent check of the series holds in the installed files.
3. ``lockstep``: flashinfer_python is sglang's pin; flashinfer_cubin equals it; the kernel
   wheel's version is FlashInfer's plus a local label, its manifest names the same
   FlashInfer, and its CUDA major is torch's.
4. ``kernels``: with ``FLASHINFER_DISABLE_JIT=1``, every module of the kernel wheel is found
   by FlashInfer and loads for this GPU's arch; known-answer tests (norm, activation,
   sampling) match torch; nothing was compiled at run time.
5. ``moe-autotune``: ``cutlass_fused_moe`` (bf16, fp8 from sm_89) inside ``autotune()``
   matches a torch reference with the default and the tuned tactic, and really tunes: it
   fails when no tactic was profiled or a tactic was skipped for a module missing from the
   jit-cache; tactics skipped for the hardware are warnings; the profiled count, the chosen
   tactic and the default/tuned time ratio (only when tuning happened) are reported.
6. ``server``: SGLang serves a model with ``--moe-runner-backend flashinfer_cutlass`` and
   ``FLASHINFER_DISABLE_JIT=1``, logs its autotune start and end with tactics profiled and
   none skipped for a missing module, answers ``/health`` and one ``/generate``, and its
   whole process group is gone afterwards (host mode; ``--model`` or ``--tiny-model``).
7. ``parallel``: the same model served at TP 1, TP 2 EP 1 and TP 2 EP 2 (NVLink multicast
   off) returns the same greedy tokens for the same token ids; a leg that needs more GPUs
   than are visible is not run, and the check is then ``not-run`` (host mode;
   ``--parallel`` with ``--model`` or ``--tiny-model``; :mod:`builder.smoke.parallel`).

Which checks count (:attr:`SmokeReport.passed`): 1-4 always; 5 when asked for (``--moe``)
or when it ran (the kernel wheel ships the fused MoE module for this GPU); 6 when a model
is given (``--model`` or ``--tiny-model``); 7 when asked for (``--parallel``). A counted
check passes with status ``passed`` or ``warning``; ``failed`` and ``not-run`` fail the
report. A check that needs a GPU and finds none fails with "no CUDA device": nothing is
ever pretended.
"""

from builder.smoke.gpu.lockstep import check_lockstep
from builder.smoke.gpu.options import SmokeOptions
from builder.smoke.gpu.probe import (
    PROBE_FILES,
    PROBE_PATH,
    SCRIPT_DIR,
    ProbeRun,
    parse_probe_output,
    probe_arguments,
    probe_files,
    run_probe_host,
)
from builder.smoke.gpu.report import (
    ALWAYS_COUNTED,
    CHECKS,
    CheckResult,
    SmokeFailed,
    SmokeReport,
    load_report,
    require_passed,
    write_report,
)
from builder.smoke.gpu.run import assemble, run_smoke
from builder.smoke.gpu.serving import PROMPT_IDS, TINY_MODEL_PATH
from builder.smoke.gpu.sglang_check import (
    InstalledTree,
    check_sglang,
    intent_patterns,
    wheel_provenance,
)

__all__ = [
    "ALWAYS_COUNTED",
    "CHECKS",
    "PROBE_FILES",
    "PROBE_PATH",
    "PROMPT_IDS",
    "SCRIPT_DIR",
    "TINY_MODEL_PATH",
    "CheckResult",
    "InstalledTree",
    "ProbeRun",
    "SmokeFailed",
    "SmokeOptions",
    "SmokeReport",
    "assemble",
    "check_lockstep",
    "check_sglang",
    "intent_patterns",
    "load_report",
    "parse_probe_output",
    "probe_arguments",
    "probe_files",
    "require_passed",
    "run_probe_host",
    "run_smoke",
    "wheel_provenance",
    "write_report",
]
