"""Image and release runs: wheel -> image -> smoke gate -> publish.

:func:`run_image` builds the target's wheel(s) and the runtime image. :func:`run_release`
goes on: a smoke gate must pass, then every check that could refuse a publish runs
before anything is published (the index's files, the registry's tag), then the wheels
the gate covered are uploaded and the image pushed, pulled back by digest and compared
with what passed the gate. The :class:`ReleaseSummary` lists exactly what was published
(index URL and file sha256, image reference and digest) and what was not, and why; a
failed release raises :class:`BuilderError` carrying it.

The gate is any :class:`SmokeGate`: a callable taking the engine client and the built
:class:`~builder.image.build.ImageResult` and returning a :class:`GateResult` (passed flag,
the wheel files it covered, a JSON report). :func:`static_gate` (the static smoke test
of :mod:`builder.smoke.static`) checks the image without a GPU; :func:`gpu_gate` adds the
smoke test on a GPU runner (:mod:`builder.smoke.gpu`), which ``release`` uses by default.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import docker

from builder.core.cache import sha256_file, sha256_json
from builder.core.engine import connect
from builder.core.errors import BuilderError, PublishError
from builder.core.lock import VersionLock, lock_path
from builder.core.options import Options, select_target
from builder.core.progress import Reporter
from builder.image.build import (
    ImageResult,
    read_extra_wheel,
)
from builder.image.kernel_gate import gate_kernel_wheels

# The one rule of released kernel sets, moved to the image stage (``image`` applies it too).
from builder.image.kernel_gate import refuse_unreleased_kernels as refuse_unreleased_kernels
from builder.image.run import ImageOptions, run_image
from builder.release.publish import (
    Index,
    Published,
    PublishStatus,
    image_state,
    pull_by_digest,
    push_image,
    registry_auth,
    split_reference,
    upload_wheel,
    wheel_state,
)
from builder.smoke.gpu import SmokeOptions, run_smoke
from builder.smoke.static import static_smoke


@dataclass(frozen=True)
class GateResult:
    """A smoke gate's verdict.

    Attributes:
        name: the gate (``static``, ``gpu``).
        passed: whether the image may be published.
        wheels: file names of the wheels the gate proved installed and working; only
            these are published (a released-wheel target has one sglang wheel per
            Python tag, and the image carries one).
        report: the gate's JSON report.
    """

    name: str
    passed: bool
    wheels: tuple[str, ...]
    report: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        """Return JSON-ready data."""
        return {"name": self.name, "passed": self.passed, "wheels": list(self.wheels),
                "report": self.report}


SmokeGate = Callable[[docker.DockerClient, ImageResult], GateResult]


def static_gate(client: docker.DockerClient, image: ImageResult) -> GateResult:
    """The static smoke test (:func:`builder.smoke.static.static_smoke`) as a gate."""
    report = static_smoke(client, image)
    wheels = ((report.installed_wheel,) if report.installed_wheel else ()) + \
        tuple(w.path.name for w in image.extra_wheels)
    return GateResult("static", report.passed, wheels, report.to_json())


def gpu_gate(*, docker_host: str | None = None, series: Path = Path("patches/series.toml"),
             moe: bool = False) -> SmokeGate:
    """The smoke test on a GPU runner (:func:`builder.smoke.gpu.run_smoke`, image mode) as a
    gate: the image runs with every GPU attached, FlashInfer may not compile, and the
    installed sglang must be the wheel being released.

    Args:
        docker_host: the engine the image is in (``None``: ``DOCKER_HOST``).
        series: the series whose intent checks must hold in the image.
        moe: count the MoE autotune check even when it cannot run.

    Returns:
        A gate; it passes only when the static smoke test and the GPU smoke test pass. A
        runner without a GPU (no NVIDIA runtime in the engine) fails it: nothing is
        published from a machine that could not test on a GPU.
    """
    def gate(client: docker.DockerClient, image: ImageResult) -> GateResult:
        static = static_gate(client, image)
        if not static.passed:
            return GateResult("gpu", False, (), {"static": static.report,
                                                 "checks": static.report.get("checks", [])})
        installed = [w.path for w in image.wheels if w.path.name in static.wheels]
        report = run_smoke(SmokeOptions(mode="image", image=image.image_id,
                                        docker_host=docker_host, series=series,
                                        sglang_wheel=installed[0] if installed else None,
                                        moe=moe))
        data = report.to_json()
        # The release summary names the failed checks by "ok".
        data["checks"] = [{**check, "ok": check["status"] in ("passed", "warning")
                           or not check["required"]} for check in data["checks"]]
        return GateResult("gpu", report.passed, static.wheels if report.passed else (), data)

    return gate


@dataclass
class ReleaseSummary:
    """What a release published, and what it did not.

    Attributes:
        image: the image built (``None`` if the release stopped before).
        gate: the smoke gate's verdict (``None`` if it did not run).
        published: published (or found already published), in order.
        not_published: (artifact, reason) for everything else.
    """

    image: ImageResult | None = None
    gate: GateResult | None = None
    published: list[Published] = field(default_factory=list)
    not_published: list[tuple[str, str]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """Return JSON-ready data."""
        return {"image": self.image.describe() if self.image else None,
                "gate": self.gate.to_json() if self.gate else None,
                "published": [p.to_json() for p in self.published],
                "not_published": [{"artifact": a, "reason": r}
                                  for a, r in self.not_published]}

    def lines(self) -> list[str]:
        """The summary as lines for people."""
        out = [p.line() for p in self.published]
        out += [f"not published: {artifact} ({reason})"
                for artifact, reason in self.not_published]
        return out or ["nothing published"]




def image_content_digest(image: ImageResult, dockerfile: Path) -> str:
    """The sha256 of what decides an image's content, for the version lock: the sglang
    and kernel wheels it installs (file names and sha256), its base (``name@digest``) and
    the Dockerfile."""
    return sha256_json({
        "wheels": sorted((w.path.name, w.sha256) for w in image.wheels),
        "extra_wheels": sorted((w.path.name, w.sha256) for w in image.extra_wheels),
        "base": image.base.reference, "dockerfile": sha256_file(dockerfile)})


@dataclass
class _Publishing:
    """A release's state from the built image on: what the publish steps share."""

    client: docker.DockerClient
    image: ImageResult
    lock: VersionLock
    image_digest: str
    target_name: str
    reporter: Reporter
    auth: dict[str, str] | None = None
    published: set[str] = field(default_factory=set)

    def record_tag(self, summary: ReleaseSummary, published: Published) -> None:
        """Add an image tag to the summary and record its content in the version lock."""
        summary.published.append(published)
        self.published.add(published.name)
        self.lock.record("image", self.target_name, published.name, self.image_digest)


def _build_and_lock(options: Options, image_options: ImageOptions,
                    client: docker.DockerClient | None) -> _Publishing:
    # Everything before the gate: the kernel wheels' rule, the image, the version lock.
    gate_kernel_wheels(options, select_target(options),
                       [read_extra_wheel(p) for p in image_options.kernel_wheels])
    client = client or connect(image_options.docker_host)
    image = run_image(options, image_options, client)
    # One tag, one content (versions.lock): a tag is keyed with its registry and
    # repository, since that is the name a puller sees.
    state = _Publishing(client=client, image=image,
                        lock=VersionLock(lock_path(options.targets_file)),
                        image_digest=image_content_digest(image, image_options.dockerfile),
                        target_name=select_target(options).name, reporter=options.reporter)
    for tag in image.tags:
        state.lock.require("image", state.target_name, tag, state.image_digest)
    return state


def _stopped(summary: ReleaseSummary, artifacts: list[str], exc: BuilderError,
             published: set[str]) -> BuilderError:
    # Every artifact not published and not already listed is "not published", with why.
    summary.not_published += [(a, f"release stopped: {exc.cause}")
                              for a in artifacts if a not in published
                              and a not in {n for n, _ in summary.not_published}]
    return exc.replaced(report=summary)


def _require_passed(result: GateResult) -> None:
    # The summary names up to three failed checks of the gate's report.
    if result.passed:
        return
    failed = [c for c in result.report.get("checks", []) if not c.get("ok", True)]
    detail = "; ".join(f"{c['name']}: {c['detail']}" for c in failed[:3])
    raise PublishError(f"the {result.name} smoke gate failed"
                       + (f": {detail}" if detail else ""),
                       "nothing was published; see the gate's report")


def _covered_wheels(result: GateResult, image: ImageResult,
                    summary: ReleaseSummary) -> dict[str, tuple[Path, str]]:
    # Only the wheels the gate covered are published; the others are listed with why.
    sha = {w.path.name: (w.path, w.sha256) for w in image.wheels}
    sha.update({w.path.name: (w.path, w.sha256) for w in image.extra_wheels})
    covered = set(result.wheels)
    for name in sha:
        if name not in covered:
            summary.not_published.append((name, f"not covered by the {result.name} smoke "
                                                 "gate (the image installs another wheel)"))
    return {name: sha[name] for name in sha if name in covered}


def _publish_wheels(index: Index, wheels: dict[str, tuple[Path, str]],
                    states: dict[str, PublishStatus | None], state: _Publishing,
                    summary: ReleaseSummary) -> None:
    # An index that has the exact file already counts as published (not uploaded again).
    for name, (path, digest) in wheels.items():
        if states[name] == "already-published":
            summary.published.append(Published("wheel", name, index.simple_url,
                                               f"sha256:{digest}", "already-published"))
        else:
            summary.published.append(upload_wheel(index, path, digest, state.reporter))
        state.published.add(name)


def _publish_tags(tag_states: dict[str, tuple[PublishStatus | None, str | None]],
                  state: _Publishing, summary: ReleaseSummary) -> None:
    # Each tag is pushed, pulled back by digest and compared with what passed the gate.
    image = state.image
    for tag in image.tags:
        found, digest_found = tag_states[tag]
        if found == "already-published" and digest_found:
            state.record_tag(summary, Published("image", tag, tag.split("/", 1)[0],
                                                digest_found, "already-published"))
            continue
        pushed = push_image(state.client, image.image_id, tag, state.auth, state.reporter)
        repository, _ = split_reference(tag)
        pulled = pull_by_digest(state.client, repository, pushed, state.auth)
        if pulled != image.image_id:
            raise PublishError(f"{repository}@{pushed} pulled back as {pulled}, not the "
                               f"image that passed the gate ({image.image_id})",
                               "check the registry")
        state.record_tag(summary, Published("image", tag, tag.split("/", 1)[0], pushed,
                                            "published"))


def run_release(options: Options, image_options: ImageOptions, index: Index,
                gate: SmokeGate = static_gate,
                client: docker.DockerClient | None = None) -> ReleaseSummary:
    """Build the wheel and image, gate on the smoke test, publish what passed.

    Args:
        options: the target and build options.
        image_options: registry, base and kernel wheels.
        index: where the wheels go.
        gate: the smoke gate (default: the static smoke test).
        client: the engine (default: :func:`builder.core.engine.connect`).

    Returns:
        the summary: every artifact published or found already published.

    Raises:
        BuilderError: any stage failed, the gate did not pass, the index or registry
            refused (down, credentials, a file or tag with other content), a push failed
            mid-stream, or the version lock records other content for an image tag
            (checked before the gate, recorded once the tag is pushed); its ``report``
            is the :class:`ReleaseSummary` so far.
    """
    summary = ReleaseSummary()
    try:
        state = _build_and_lock(options, image_options, client)
    except BuilderError as exc:
        what = f"target {options.target}" if options.target else "the default target"
        summary.not_published.append((f"the wheels and image of {what}",
                                      f"release stopped: {exc.cause}"))
        raise exc.replaced(report=summary) from None  # the failing stage's type and status
    image = summary.image = state.image
    artifacts = [w.path.name for w in image.wheels] + \
        [w.path.name for w in image.extra_wheels] + list(image.tags)
    options.reporter.info(f"smoke gate on {image.image_id}")
    try:
        summary.gate = gate(state.client, image)
        _require_passed(summary.gate)
    except BuilderError as exc:
        raise _stopped(summary, artifacts, exc, set()) from None
    wheels = _covered_wheels(summary.gate, image, summary)
    state.auth = registry_auth()
    try:
        # Every check that can refuse runs before anything is published.
        states = {name: wheel_state(index, *wheels[name]) for name in wheels}
        tag_states = {tag: image_state(state.client, image.image_id, tag, state.auth)
                      for tag in image.tags}
        _publish_wheels(index, wheels, states, state, summary)
        _publish_tags(tag_states, state, summary)
    except BuilderError as exc:
        raise _stopped(summary, artifacts, exc, state.published) from None
    return summary
