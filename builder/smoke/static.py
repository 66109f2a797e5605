"""Static smoke test of a runtime image: what is installed inside it, read from inside it.

Runs ``python3`` in a container of the image (no network) and reads, without importing
sglang (which needs a GPU stack): the installed distributions and their versions and
sizes, our provenance record from sglang's ``.dist-info``, the ``WHEEL`` tags pip
installed, and for every hunk our patches changed the installed file's line at the
hunk's ``changed_line``. It passes when the version and the provenance equal the wheel's,
every patched line equals that line in the wheel, and every extra (kernel) wheel is
installed at its version; and the SM120 launch profile is in the image as its labels say
(same sha256) and the launcher ``sglang-sm120-serve`` runs (a dry run: it prints
``python -m sglang.launch_server`` with the profile's arguments, then the test's). This is
the release gate until the GPU smoke test takes over
(:mod:`builder.release.run` takes any gate of the same shape).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import re
import shlex
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker
import docker.errors
import requests.exceptions
from packaging.utils import parse_wheel_filename

from builder.core.errors import BuildError
from builder.core.layout import Layout
from builder.image.build import LABEL_NS, ImageResult
from builder.image.profile import LAUNCHER_PATH, PROFILE_PATH
from builder.kernels.preflight import Check
from builder.wheel.build import PROVENANCE_FILE, WheelResult

#: Runs inside the image (``python3 -c``), standard library only; input and output are
#: JSON. Read from builder/smoke/script/, where what runs in other interpreters lives.
_PROBE = (Path(__file__).with_name("script") / "static_probe.py").read_text()


@dataclass(frozen=True)
class PatchedLine:
    """A line a patch changed: where, and what it must read."""

    path: str
    line: int
    expected: str
    found: str | None

    def to_json(self) -> dict[str, Any]:
        """Return JSON-ready data."""
        return {"path": self.path, "line": self.line, "expected": self.expected,
                "found": self.found}


@dataclass(frozen=True)
class StaticSmokeReport:
    """What the static smoke test read inside an image, and its verdict.

    Attributes:
        image: the image ID or reference tested.
        checks: each check, with what was found.
        installed: distribution name -> ``{"version", "installed_size"}`` (``None`` when
            not installed).
        lines: the patched lines read.
        installed_wheel: the sglang wheel file pip installed (matched by its tags).
    """

    image: str
    checks: tuple[Check, ...]
    installed: dict[str, Any]
    lines: tuple[PatchedLine, ...]
    installed_wheel: str | None

    @property
    def passed(self) -> bool:
        """True when checks ran and every one passed (none ran proves nothing)."""
        return bool(self.checks) and all(check.ok for check in self.checks)

    @property
    def installed_size(self) -> int:
        """Bytes the installed distributions occupy (every file in their ``RECORD``)."""
        return sum(d["installed_size"] for d in self.installed.values() if d)

    def to_json(self) -> dict[str, Any]:
        """Return JSON-ready data."""
        return {"kind": "static", "image": self.image, "passed": self.passed,
                "checks": [c.to_json() for c in self.checks], "installed": self.installed,
                "lines": [line.to_json() for line in self.lines],
                "installed_wheel": self.installed_wheel}


def _hunk_lines(wheel: WheelResult) -> list[tuple[str, int]]:
    out = []
    for patch in wheel.provenance["patches"]:
        if patch["status"] != "applied":
            continue
        for file in patch["files"]:
            path = Layout("sdist").tree_path(file["path"])
            for hunk in file["hunks"]:
                if path and hunk.get("changed_line"):
                    out.append((path, int(hunk["changed_line"])))
    return out


def _wheel_line(wheel: WheelResult, path: str, number: int) -> str:
    with zipfile.ZipFile(wheel.path) as archive:
        lines = archive.read(path).decode().splitlines()
    return lines[number - 1] if 0 < number <= len(lines) else ""


def _matching_wheel(wheels: tuple[WheelResult, ...], tags: list[str]) -> WheelResult | None:
    for wheel in wheels:
        _, _, _, wheel_tags = parse_wheel_filename(wheel.path.name)
        if {str(t) for t in wheel_tags} == set(tags):
            return wheel
    return None


def _run_probe(client: docker.DockerClient, ref: str, spec: dict[str, Any],
               timeout: int) -> bytes:
    api = client.api
    try:
        container = api.create_container(
            ref, entrypoint=["python3", "-c", _PROBE], environment={"SM120_SMOKE":
                                                                      json.dumps(spec)},
            network_disabled=True, host_config=api.create_host_config(network_mode="none"))
    except (docker.errors.APIError, requests.exceptions.RequestException) as exc:
        message = getattr(exc, "explanation", None) or str(exc)
        raise BuildError(f"cannot run a container of {ref}: {message}",
                         "is the image in the engine?") from None
    try:
        api.start(container)
        try:
            status = api.wait(container, timeout=timeout)["StatusCode"]
        except requests.exceptions.ConnectionError:  # docker-py's read timeout
            raise BuildError(f"the smoke probe in {ref} did not finish in {timeout} s",
                             "run the image by hand to see why") from None
        if status != 0:
            stderr = api.logs(container, stdout=False, stderr=True).decode(errors="replace")
            lines = stderr.strip().splitlines()
            raise BuildError(f"the smoke probe failed inside {ref} (exit {status}): "
                             f"{lines[-1] if lines else ''}",
                             "the image needs python3 on PATH")
        return bytes(api.logs(container, stdout=True, stderr=False))
    except docker.errors.APIError as exc:
        raise BuildError(f"the smoke probe in {ref} failed: {exc.explanation or exc}",
                         "check the engine") from None
    finally:
        with contextlib.suppress(docker.errors.APIError):
            api.remove_container(container, force=True)


_SMOKE_ARGS = ("--model-path", "/sm120-smoke/model")
_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=.*")


def _launch_checks(image: ImageResult, found: dict[str, Any]) -> list[Check]:
    """The launch profile (by sha256, against the label) and the launcher's dry run."""
    expected = image.labels.get(f"{LABEL_NS}.launch-profile.sha256")
    got = found.get("profile_sha256")
    checks = [Check("launch profile", bool(expected) and got == expected,
                    "no launch profile label on the image" if not expected else
                    f"missing at {image.labels[f'{LABEL_NS}.launch-profile']}" if got is None
                    else f"sha256 {got}" + ("" if got == expected else
                                            f", the label says {expected}"))]
    launcher = found.get("launcher")
    if launcher is None:
        checks.append(Check("launcher", False, f"{LAUNCHER_PATH} missing or not executable"))
        return checks
    lines = launcher["stdout"].strip().splitlines()
    words = shlex.split(lines[-1]) if launcher["status"] == 0 and lines else []
    # The dry run prints the line a shell runs: NAME=VALUE assignments, then the command.
    assigned = dict(w.split("=", 1) for w in itertools.takewhile(_ASSIGNMENT.fullmatch, words))
    argv = words[len(assigned):]
    wanted = image.profile.options() if image.profile else []
    missing = [option for option in wanted if option not in argv]
    # With the kernel wheels in the image the server must not JIT-compile FlashInfer.
    jit_off = assigned.get("FLASHINFER_DISABLE_JIT") == "1" or \
        not any(w.manifest is not None for w in image.extra_wheels)
    if not jit_off:
        missing.append("FLASHINFER_DISABLE_JIT=1")
    ok = argv[1:3] == ["-m", "sglang.launch_server"] and \
        tuple(argv[-len(_SMOKE_ARGS):]) == _SMOKE_ARGS and not missing
    detail = shlex.join(words) if ok else \
        f"exit {launcher['status']}: {launcher['stderr'].strip()[-300:]}" \
        if launcher["status"] != 0 else f"printed {lines[-1] if lines else ''!r}" + \
        (f", without {', '.join(missing)}" if missing else "")
    checks.append(Check("launcher", ok, detail))
    return checks


def static_smoke(client: docker.DockerClient, image: ImageResult, *,
                 reference: str | None = None, timeout: int = 300) -> StaticSmokeReport:
    """Run the static smoke test in a container of ``reference`` (default: the image ID).

    Args:
        client: the engine holding the image.
        image: what was built (wheels, versions, extra wheels).
        reference: the image to run, e.g. a pulled-back ``repo@digest``.
        timeout: seconds the probe may take.

    Returns:
        the report; ``passed`` is the verdict (a failed check is not an exception).

    Raises:
        BuilderError: the container could not be run at all (image missing, engine
            error) or printed no JSON.
    """
    ref = reference or image.image_id
    wheel = image.wheels[0]
    hunks = _hunk_lines(wheel)
    dists = ["sglang", *(w.name for w in image.extra_wheels)]
    spec = {"dists": dists, "provenance_file": PROVENANCE_FILE,
            "lines": [{"path": p, "line": n} for p, n in hunks],
            "profile": image.labels.get(f"{LABEL_NS}.launch-profile", PROFILE_PATH),
            "launcher": image.labels.get(f"{LABEL_NS}.launcher", LAUNCHER_PATH),
            "launcher_args": list(_SMOKE_ARGS)}
    output = _run_probe(client, ref, spec, timeout)
    try:
        found = json.loads(output.decode().strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise BuildError(f"the smoke probe in {ref} printed no JSON",
                         "run the image by hand to see why") from None

    checks = []
    sglang = found["dists"].get("sglang")
    got = sglang["version"] if sglang else "not installed"
    checks.append(Check("sglang version", got == wheel.version,
                        f"{got} (expected {wheel.version})"))
    installed = _matching_wheel(image.wheels, found["wheel_tags"])
    checks.append(Check("provenance", found["provenance"] == wheel.provenance,
                        "equals the wheel's sm120-provenance.json"
                        if found["provenance"] == wheel.provenance else
                        "missing" if found["provenance"] is None else
                        "differs from the wheel's"))
    lines = []
    read = found["lines"] or [None] * len(hunks)  # no sglang installed: nothing read
    for (path, number), line in zip(hunks, read, strict=True):
        expected = _wheel_line(wheel, path, number)
        lines.append(PatchedLine(path, number, expected, line))
        checks.append(Check(f"patched line {path}:{number}", line == expected,
                            f"{line!r}" if line == expected else
                            f"found {line!r}, the wheel has {expected!r}"))
    if not hunks:
        checks.append(Check("patched lines", False, "the provenance lists no changed line"))
    for extra in image.extra_wheels:
        dist = found["dists"].get(extra.name)
        got = dist["version"] if dist else "not installed"
        checks.append(Check(f"{extra.name} version", got == extra.version,
                            f"{got} (expected {extra.version})"))
    checks += _launch_checks(image, found)
    return StaticSmokeReport(ref, tuple(checks), found["dists"], tuple(lines),
                             installed.path.name if installed else None)
