"""Smoke check 7: the same greedy tokens at TP 2 / EP 2 as at TP 1.

Each leg (:data:`LEGS`, in order) starts one SGLang server through check 6's orchestration
(:func:`builder.smoke.server.run_server_check`) with ``--tp-size N --ep-size M``, asks it
for the same token ids greedily, and stops it. The check passes when every leg answers
the tokens TP 1 answered; otherwise it names the leg and the first position that differs.
Why: the worst fault of the SM12x series showed only with ``--ep-size > 1`` (expert ids
remapped to local ids while the CUTLASS runner expects global ones), and every other GPU
check runs on one GPU.

A leg that needs more GPUs than are visible is not run (its reason is recorded) and the
check is then ``not-run``, never ``passed``; the legs that fit still run.

SGLang facts used (``sglang/srt/server_args.py``, 0.5.16): ``--tp-size`` and ``--ep-size``
set the tensor- and expert-parallel sizes; the expert-parallel group splits the experts
between its ranks, so the expert count must divide by ``--ep-size``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from builder.core.userfiles import parse_json
from builder.smoke.server import ServerSpec, free_port, run_server_check
from builder.smoke.shared import Status

#: NVLink multicast off in the server, as on every lent multi-GPU machine: NCCL's NVLS
#: algorithms, PyTorch's symmetric-memory multicast and NVSHMEM's NVLS (the lent hosts
#: cannot give a process multicast objects).
PARALLEL_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                "NVSHMEM_DISABLE_NVLS": "1"}

#: Greedy tokens asked of each leg, and the candidates per position kept to judge a
#: difference (the top-2 margin at TP 1 tells bf16 noise from a fault).
NEW_TOKENS = 16
TOP_LOGPROBS = 2

#: ``config.json`` keys that hold a MoE model's expert count (Qwen3-MoE and Qwen2-MoE,
#: Mixtral, DeepSeek-V2/V3 in Transformers' configurations).
EXPERT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts")


@dataclass(frozen=True)
class ParallelOutcome:
    """Check 7's result (:mod:`builder.smoke.gpu` makes it the report's ``parallel``).

    Attributes:
        status: ``passed``, ``failed`` or ``not-run``.
        detail: one line.
        data: the GPU count, the expert count, the environment set, and per leg its
            status, detail, output ids, top-2 logprobs, command and stop; the first
            difference when there is one.
    """

    status: Status
    detail: str
    data: dict[str, Any]


@dataclass(frozen=True)
class Leg:
    """One server start of the check.

    Attributes:
        tp: ``--tp-size`` (also the GPUs it needs).
        ep: ``--ep-size``.
    """

    tp: int
    ep: int

    @property
    def name(self) -> str:
        """``TP 1``, ``TP 2 EP 1``, ``TP 2 EP 2``."""
        return f"TP {self.tp}" if self.tp == 1 and self.ep == 1 else \
            f"TP {self.tp} EP {self.ep}"

    def args(self) -> tuple[str, ...]:
        """The server arguments of this leg."""
        return ("--tp-size", str(self.tp), "--ep-size", str(self.ep))


#: The legs in order; the first is the reference.
LEGS = (Leg(1, 1), Leg(2, 1), Leg(2, 2))

#: Server arguments the legs set themselves (refused in ``--server-arg``).
PARALLEL_ARGS = ("--tp-size", "--tp", "--tensor-parallel-size", "--ep-size", "--ep",
                 "--expert-parallel-size")


def expert_count(model: Path) -> int | None:
    """The model's routed expert count from its ``config.json`` (``None``: none found).

    Raises:
        OSError, ValueError: no readable JSON ``config.json``.
    """
    config = parse_json((model / "config.json").read_text())
    for key in EXPERT_KEYS:
        value = config.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def first_difference(reference: Sequence[int], other: Sequence[int]) -> int | None:
    """The first position where ``other`` differs from ``reference`` (a missing token
    counts as a difference); ``None`` when they are equal."""
    for position, (ref, got) in enumerate(zip(reference, other, strict=False)):
        if ref != got:
            return position
    return None if len(reference) == len(other) else min(len(reference), len(other))


def _margin(top: Any, position: int) -> float | None:
    """TP 1's logprob gap between its two most likely tokens at ``position``."""
    try:
        first, second = top[position][0][0], top[position][1][0]
        return round(float(first) - float(second), 4)
    except (TypeError, IndexError, ValueError):
        return None


def run_parallel_check(command: Callable[[int, tuple[str, ...]], tuple[str, ...]], *,
                       gpus: int, experts: int | None, env: Mapping[str, str],
                       prompt_ids: Sequence[int], ready_timeout: float = 1800.0,
                       stop_grace: float = 30.0, legs: Sequence[Leg] = LEGS,
                       info: Callable[[str], None] = lambda _: None) -> ParallelOutcome:
    """Run check 7's legs in order and compare their tokens with the first leg's.

    Args:
        command: the server's command line for a port and the leg's extra arguments
            (:func:`builder.smoke.server.sglang_command` on a GPU runner).
        gpus: the CUDA devices the tested interpreter sees (the probe's runner check).
        experts: the model's expert count (:func:`expert_count`).
        env: the server's environment besides :data:`PARALLEL_ENV` (which wins).
        prompt_ids: the prompt's token ids (the server runs with
            ``--skip-tokenizer-init``).
        ready_timeout: seconds for each server to become ready.
        stop_grace: seconds between SIGTERM and SIGKILL.
        legs: the legs, the reference first.
        info: progress messages.

    Returns:
        The ``parallel`` result: ``passed`` when every leg ran and answered the first
        leg's tokens; ``failed`` naming the first leg whose server failed or whose tokens
        differ (with the position, both tokens and the reference's top-2 margin there);
        ``not-run`` when all that ran agreed but a leg lacked GPUs. Never raises for the
        servers' behaviour.
    """
    need = max(leg.ep for leg in legs)
    data: dict[str, Any] = {"gpus": gpus, "experts": experts, "env": dict(PARALLEL_ENV),
                            "prompt_ids": list(prompt_ids), "legs": []}
    if experts is None or experts % need:
        found = "no expert count in its config.json (" + ", ".join(EXPERT_KEYS) + ")" \
            if experts is None else f"{experts} experts"
        return ParallelOutcome(Status.FAILED, f"EP {need} needs an expert count divisible by "
                               f"{need}; the model has {found}", data)
    results: list[dict[str, Any]] = data["legs"]
    for leg in legs:
        entry: dict[str, Any] = {"leg": leg.name, "tp": leg.tp, "ep": leg.ep}
        results.append(entry)
        if leg.tp > gpus:
            entry.update(status=Status.NOT_RUN, detail=f"TP {leg.tp} needs {leg.tp} GPUs, {gpus} "
                         "visible")
            continue
        port = free_port()
        info(f"Check 7: starting SGLang at {leg.name} on 127.0.0.1:{port} ...")
        outcome = run_server_check(ServerSpec(
            command=command(port, leg.args()), base_url=f"http://127.0.0.1:{port}",
            env={**env, **PARALLEL_ENV}, ready_timeout=ready_timeout,
            stop_grace=stop_grace, input_ids=tuple(prompt_ids),
            max_new_tokens=NEW_TOKENS, top_logprobs=TOP_LOGPROBS))
        entry.update(status=outcome.status, detail=outcome.detail,
                     output_ids=outcome.data.get("generated_ids"),
                     top_logprobs=outcome.data.get("top_logprobs"),
                     command=outcome.data.get("command"),
                     stopped_by=outcome.data.get("stopped_by"),
                     seconds=outcome.data.get("seconds"))
        if outcome.status not in (Status.PASSED, Status.WARNING):
            entry["log_tail"] = outcome.data.get("log_tail")
    return _judge(data)


def _judge(data: dict[str, Any]) -> ParallelOutcome:
    """The verdict over the legs in ``data["legs"]`` (the first is the reference)."""
    legs = data["legs"]
    for entry in legs:
        if entry["status"] not in (Status.PASSED, Status.WARNING, Status.NOT_RUN):
            return ParallelOutcome(Status.FAILED, f"{entry['leg']}: {entry['detail']}", data)
    reference = legs[0]
    if reference["status"] == Status.NOT_RUN:
        return ParallelOutcome(Status.NOT_RUN, f"{reference['leg']}: {reference['detail']}", data)
    ref_ids = reference["output_ids"]
    for entry in legs[1:]:
        if entry["status"] == Status.NOT_RUN:
            continue
        position = first_difference(ref_ids, entry["output_ids"])
        if position is None:
            continue
        got = entry["output_ids"][position] if position < len(entry["output_ids"]) else None
        want = ref_ids[position] if position < len(ref_ids) else None
        margin = _margin(reference.get("top_logprobs"), position)
        data["first_difference"] = {"leg": entry["leg"], "position": position,
                                    "reference": want, "got": got,
                                    "reference_top2_margin": margin}
        detail = (f"{entry['leg']} differs from {reference['leg']} at position {position}: "
                  f"token {got} instead of {want}")
        if margin is not None:
            detail += (f" ({reference['leg']}'s top-2 logprob margin there: {margin:g}; "
                       "near 0 is bf16 noise, large is a fault)")
        return ParallelOutcome(Status.FAILED, detail, data)
    ran = [e["leg"] for e in legs if e["status"] != Status.NOT_RUN]
    skipped = [f"{e['leg']} not run: {e['detail']}" for e in legs if e["status"] == Status.NOT_RUN]
    same = (f"{', '.join(ran)} returned the same {len(ref_ids)} token ids" if len(ran) > 1
            else f"{ran[0]} returned {len(ref_ids)} token ids, nothing to compare them with")
    if skipped:
        return ParallelOutcome(Status.NOT_RUN, f"{same}; " + "; ".join(skipped), data)
    return ParallelOutcome(Status.PASSED, same, data)
