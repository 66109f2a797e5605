"""Modelled wall time of a sharded kernel build, from the step costs a real build recorded.

Reads a step-costs file (``<cache>/kernel-costs/*.json``, written after every kernel build;
the x2 run's is ``reports/2026-11-30-x2-kernels/step-costs.json``) and prints, for N
runners of C cores, the wall time of ``kernels --shard I/N`` on every runner at once
followed by the final job's link (``builder.kernels.shard.model_wall_time``: each shard's
LPT share of the steps on its job slots; the final job's compiles are cache hits), next to
the critical path (the longest step plus the longest link) and the one-runner time
measured. Job slots per runner are its cores, or fewer where the builder's memory bound
(6 GiB a job with the CUTLASS MoE) binds with ``--memory GIB`` per core.

Not counted: runner start-up, the build environment's install, cache transfers. Step
times come from a machine running one job per core; a runner with as many jobs as cores
is assumed to take as long per step.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from builder.kernels.shard import StepCosts, makespan, model_wall_time

_JOB_GIB = 6  # builder.kernels.build._JOB_MEMORY["fused_moe"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--costs", type=Path,
                        default=Path("reports/2026-11-30-x2-kernels/step-costs.json"))
    parser.add_argument("--measured", type=float, default=None,
                        help="the one-runner compile seconds measured (for the ratio)")
    parser.add_argument("--runners", default="1,2,4,8,16")
    parser.add_argument("--cores", default="4,16")
    parser.add_argument("--memory", type=float, default=None, metavar="GIB",
                        help="memory per core: job slots = min(cores, cores*GIB // 6)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    data = StepCosts(args.costs).read()
    steps, links = data["steps"], data["links"]
    rows = []
    for cores in (int(c) for c in args.cores.split(",")):
        jobs = cores if args.memory is None else max(1, min(cores,
                                                            int(cores * args.memory) // _JOB_GIB))
        for runners in (int(n) for n in args.runners.split(",")):
            model = model_wall_time(steps, links, runners, jobs)
            rows.append({"runners": runners, "cores": cores, "jobs": jobs, **model})
    total = sum(steps.values())
    summary = {"costs": str(args.costs), "compile_steps": len(steps),
               "step_seconds_total": round(total, 1),
               "longest_step": max(steps, key=lambda s: steps[s]),
               "longest_step_seconds": max(steps.values()),
               "recorded_jobs": data.get("jobs"),
               "model_one_runner_recorded_jobs": round(
                   makespan(list(steps.values()), int(data.get("jobs") or 1))
                   + makespan(list(links.values()), int(data.get("jobs") or 1)), 1),
               "measured": args.measured, "rows": rows}
    if args.json:
        print(json.dumps(summary, indent=1))
        return
    print(f"{len(steps)} compile steps, {total:.0f} s of step time; longest "
          f"{summary['longest_step']} {summary['longest_step_seconds']:.0f} s; the model "
          f"for one runner of {data.get('jobs')} jobs: "
          f"{summary['model_one_runner_recorded_jobs']} s"
          + (f" (measured {args.measured} s)" if args.measured else ""))
    print("| runners N | cores | jobs | slowest shard s | link s | wall s | critical path s |"
          + (" vs measured |" if args.measured else ""))
    print("|---|---|---|---|---|---|---|" + ("---|" if args.measured else ""))
    for row in rows:
        ratio = f" {row['wall'] / args.measured:.2f} |" if args.measured else ""
        print(f"| {row['runners']} | {row['cores']} | {row['jobs']} | {row['shards']} | "
              f"{row['link']} | {row['wall']} | {row['critical_path']} |" + ratio)


if __name__ == "__main__":
    main()
