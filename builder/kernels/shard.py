"""One cold kernel build spread over CI jobs: shards of FlashInfer's ninja graph.

``python -m builder kernels build --shard I/N --sccache`` compiles a deterministic 1/N of the
compile steps (translation units) of the graph FlashInfer writes for the request into the
shared sccache backend, and writes no wheel. The final job, without ``--shard``, builds the
whole graph as usual: every object it finds in the backend is a cache hit, anything a dead
shard left out is compiled there, then it links, checks the SASS and packs. The wheel is
therefore the unsharded build's whatever the shards did.

The split balances the steps by their measured cost (seconds of each step of an earlier
build, read from ninja's log and recorded by the builder after every build: a
:class:`StepCosts` file), longest first onto the least-loaded shard (LPT). Every shard
computes the same split from the same step list and costs, so no coordinator is needed.
"""

from __future__ import annotations

import fcntl
import heapq
import json
import re
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from builder.core.cache import atomic_write_bytes
from builder.core.errors import ConfigurationError
from builder.core.userfiles import parse_json

#: The most shards: GitHub Actions runs at most 256 jobs of one matrix ("Using a matrix
#: for your jobs", docs.github.com); a larger N is a typo, and each shard is a runner.
MAX_SHARDS = 256
#: The longest one step may have taken: a day. The slowest measured CUTLASS MoE unit takes
#: minutes (data/step-costs-*.json); more is a clock jump or a hand edit, not a cost.
MAX_STEP_SECONDS = 86_400.0
#: The most parallel compile jobs: the ``--jobs`` flag's own cap (``builder.cli.common``).
MAX_JOBS = 1024


@dataclass(frozen=True)
class Shard:
    """Shard ``index`` of ``count`` (1-based, as CI matrices count).

    Attributes:
        index: 1 .. count.
        count: the number of shards.
    """

    index: int
    count: int

    def __post_init__(self) -> None:
        """Refuse a shard that is not ``1 <= index <= count <= MAX_SHARDS`` in whole numbers.

        Raises:
            ConfigurationError: it is not (a float, a bool, NaN, zero, a negative, or more
                shards than :data:`MAX_SHARDS`).
        """
        if not (type(self.index) is int and type(self.count) is int
                and 1 <= self.index <= self.count <= MAX_SHARDS):
            raise _not_a_shard(f"{self.index}/{self.count}")

    @classmethod
    def parse(cls, text: str) -> Shard:
        """Read ``I/N`` (``2/4``).

        Raises:
            ConfigurationError: not ``I/N`` in ASCII digits with
                ``1 <= I <= N <= MAX_SHARDS``.
        """
        # ASCII only, and short: int() reads other scripts' digits and refuses 4,300+ of them.
        found = re.fullmatch(r"\s*(\d{1,9})\s*/\s*(\d{1,9})\s*", text, re.ASCII)
        if not found:
            raise _not_a_shard(text)
        return cls(int(found[1]), int(found[2]))

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


def _not_a_shard(text: str) -> ConfigurationError:
    return ConfigurationError(f"shard {text!r} is not I/N with 1 <= I <= N <= {MAX_SHARDS}",
                              "write e.g. --shard 1/4 ... --shard 4/4, one per CI job")


def _seconds(values: Any, path: Path) -> dict[str, float]:
    """``{step: seconds}`` of a costs file, every value finite, from 0 to a day.

    Raises:
        ConfigurationError: a value is not (NaN, an infinity, a negative, more than
            :data:`MAX_STEP_SECONDS`, a bool or not a number); the message names the step.
        TypeError, AttributeError: ``values`` is not a mapping (the caller says so).
    """
    seconds = {}
    for step, value in values.items():
        if type(value) not in (int, float) or not 0 <= value <= MAX_STEP_SECONDS:
            # NaN fails every comparison, so it lands here as infinities do.
            raise ConfigurationError(
                f"{path}: step {step!r} took {value!r} seconds, not a number from 0 to "
                f"{MAX_STEP_SECONDS:g}", "pass a file a kernel build wrote (kernel-costs/"
                "*.json in the cache), or delete it to start again")
        seconds[str(step)] = float(value)
    return seconds


def _weights(steps: list[str], costs: dict[str, float]) -> dict[str, float]:
    """Each step's cost; a step never measured weighs the median of those that were (all
    weigh 1 when none was)."""
    known = [costs[s] for s in steps if s in costs]
    default = statistics.median(known) if known else 1.0
    return {s: max(costs.get(s, default), 0.0) for s in steps}


def partition(steps: list[str], costs: dict[str, float], count: int) -> list[list[str]]:
    """Split compile steps into ``count`` shards of about equal cost.

    Longest-processing-time first: steps by falling cost (then name), each onto the shard
    with the least total so far (then the lowest index). Deterministic for the same steps
    and costs, whatever order ``steps`` comes in.

    Args:
        steps: the compile steps (names relative to FlashInfer's build folder).
        costs: seconds per step from an earlier build (missing ones: see ``_weights``).
        count: number of shards (``>= 1``).

    Returns:
        ``count`` lists of step names, each sorted; together every step exactly once.
    """
    weights = _weights(sorted(set(steps)), costs)
    heap = [(0.0, index) for index in range(count)]
    shards: list[list[str]] = [[] for _ in range(count)]
    for step in sorted(weights, key=lambda s: (-weights[s], s)):
        load, index = heapq.heappop(heap)
        shards[index].append(step)
        heapq.heappush(heap, (load + weights[step], index))
    return [sorted(shard) for shard in shards]


def makespan(durations: list[float], slots: int) -> float:
    """Wall time of independent jobs on ``slots`` parallel slots, longest first onto the
    first free slot (how ninja with ``-j slots`` runs a ready list, to first order)."""
    finish = [0.0] * max(1, slots)
    for duration in sorted(durations, reverse=True):
        heapq.heapreplace(finish, finish[0] + duration)
    return max(finish)


def model_wall_time(compile_costs: dict[str, float], link_costs: dict[str, float],
                    runners: int, jobs: int) -> dict[str, float]:
    """Modelled wall time of a sharded build (the issue's model).

    The shards run at once, each its LPT share of the compile steps on ``jobs`` slots;
    then the final job links (its compile steps are cache hits, counted as free). No
    runner start-up, download or cache transfer is counted.

    Args:
        compile_costs: seconds per compile step (measured).
        link_costs: seconds per link step (measured).
        runners: shard jobs (N).
        jobs: parallel compile jobs per runner (its cores, or fewer where memory binds).

    Returns:
        ``shards`` (the slowest shard), ``critical_path`` (the longest step plus the
        longest link: no N does better), ``link`` and ``wall`` (seconds).
    """
    shards = partition(list(compile_costs), compile_costs, runners)
    slowest = max(makespan([compile_costs[s] for s in shard], jobs) for shard in shards)
    link = makespan(list(link_costs.values()), jobs)
    critical = max(compile_costs.values(), default=0.0) + max(link_costs.values(),
                                                              default=0.0)
    return {"shards": round(slowest, 1), "link": round(link, 1),
            "critical_path": round(critical, 1), "wall": round(slowest + link, 1)}


class StepCosts:
    """Seconds per step of FlashInfer's ninja graph, recorded after every build.

    One JSON file per request (``<cache>/kernel-costs/<request hash>.json``, or a file
    given with ``--step-costs``): ``{"steps": {name: seconds}, "links": {name: seconds},
    "jobs": N}``. A later build overwrites the steps it ran and keeps the others, so the
    shards of one build together refresh the whole file.
    """

    def __init__(self, path: Path) -> None:
        """Args:
            path: the JSON file (need not exist yet)."""
        self.path = path

    def read(self) -> dict[str, Any]:
        """The recorded costs (empty when none were recorded).

        Raises:
            BuilderError: the file exists but is not a costs file.
            ConfigurationError: a step's seconds are not finite from 0 to
                :data:`MAX_STEP_SECONDS`, or ``jobs`` is not a count (see
                :data:`MAX_JOBS`).
        """
        if not self.path.exists():
            return {"steps": {}, "links": {}}
        try:
            data = parse_json(self.path.read_text())
            steps = _seconds(data.get("steps", {}), self.path)
            links = _seconds(data.get("links", {}), self.path)
        except (OSError, ValueError, AttributeError, TypeError) as error:
            raise ConfigurationError(f"{self.path} is not a step-costs file ({error})",
                                     "pass a file a kernel build wrote (kernel-costs/*.json in "
                                     "the cache), or delete it to start again") from None
        jobs = data.get("jobs", 1)
        if type(jobs) is not int or not 1 <= jobs <= MAX_JOBS:
            raise ConfigurationError(f"{self.path}: jobs is {jobs!r}, not a whole number "
                                     f"from 1 to {MAX_JOBS}",
                                     "pass a file a kernel build wrote, or delete it")
        return {**data, "steps": steps, "links": links}

    def record(self, seconds: dict[str, float], compile_steps: set[str],
               jobs: int) -> None:
        """Merge one build's step times into the file (atomically).

        Args:
            seconds: seconds per step that ran (from ninja's log).
            compile_steps: which of the graph's steps compile (the rest link).
            jobs: the build's parallel jobs (step times rise with the load).
        """
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # Shards on one machine (or one shared cache) finish at once: merge in turn.
        with open(self.path.with_name(self.path.name + ".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            data = self.read()
            for step, took in seconds.items():
                data["steps" if step in compile_steps else "links"][step] = took
            data["jobs"] = jobs
            atomic_write_bytes(self.path, (json.dumps(data, indent=1, sort_keys=True)
                                           + "\n").encode())
