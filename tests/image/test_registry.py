"""Registry answers are checked for shape, identity and size before anything is pinned.

A registry on 127.0.0.1 (``http.server``, serving bodies built here) answers with
malformed image indexes, a platform entry whose digest is a tag, a body over
containerd's 4 MiB manifest limit, and a ``HEAD`` that names another manifest. Every
one is one clear error (``verification failed``, exit 1 from ``pin-images``) and the pins
file stays byte for byte; a hypothesis property throws arbitrary JSON at the resolver: it
either returns a sha256 pin or raises :class:`VerificationError` (malformed) or
:class:`SourceError` (well formed, without the platform asked for), nothing else.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from builder.core.errors import SourceError, VerificationError
from builder.image.registry import resolve
from tests.helpers.cli import run_cli
from tests.helpers.registry import (
    CHILD,
    DIGEST,
    GOOD_ENTRY,
    MAX_MANIFEST_BYTES,
    Hostile,
    digest,
    index,
)

BAD_INDEXES = {
    "child digest is a tag": (index([{**GOOD_ENTRY, "digest": "latest"}]),
                              "digest 'latest' is not sha256:<64 hex>"),
    "child digest upper-case": (index([{**GOOD_ENTRY,
                                        "digest": GOOD_ENTRY["digest"].upper()}]),
                                "is not sha256:<64 hex>"),
    "platform a string": (index([{**GOOD_ENTRY, "platform": "linux/amd64"}]),
                          "platform 'linux/amd64' is not an object"),
    "manifests an object": (index({"linux/amd64": GOOD_ENTRY}),
                            "manifests is a dict, not a list"),
    "entry not an object": (index(["linux/amd64"]), "entry #1 is not an object"),
    "size negative": (index([{**GOOD_ENTRY, "size": -1}]), "size -1 is not"),
    "size a string": (index([{**GOOD_ENTRY, "size": "12"}]), "size '12' is not"),
    "media type unknown": (json.dumps({"schemaVersion": 1, "mediaType": "x/y",
                                       "manifests": []}).encode(), "'x/y', not an OCI"),
    "over 4 MiB": (index([GOOD_ENTRY], annotations={"pad": "x" * MAX_MANIFEST_BYTES}),
                   f"over {MAX_MANIFEST_BYTES} bytes"),
}


@pytest.mark.parametrize("case", list(BAD_INDEXES))
def test_malformed_index_is_one_error_and_the_pins_file_is_kept(
        case: str, hostile: tuple[Hostile, str], tmp_path: Path) -> None:
    state, name = hostile
    state.tag_body, message = BAD_INDEXES[case]
    pins = tmp_path / "pins.toml"
    pins.write_text(f'# mine\n[[kernel_base]]\ncuda_lane = "13.0"\nname = "{name}"\n'
                    'digest = ""\n')
    before = pins.read_bytes()
    (tmp_path / "docker").mkdir()
    (tmp_path / "docker" / "config.json").write_text("{}")
    done = run_cli("pin-images", "--pins-file", str(pins),
                   env={"DOCKER_CONFIG": str(tmp_path / "docker")})
    assert done.returncode == 1, done.stdout + done.stderr  # not a digest: no retry helps
    assert "verification failed: " in done.stderr
    assert message in " ".join(done.stderr.split()) and "Traceback" not in done.stderr
    assert pins.read_bytes() == before


def test_a_pins_name_without_a_tag_is_the_users_input(tmp_path: Path) -> None:
    pins = tmp_path / "pins.toml"
    pins.write_text('[[kernel_base]]\ncuda_lane = "13.0"\nname = "127.0.0.1:9/x"\n'
                    'digest = ""\n')
    before = pins.read_bytes()
    done = run_cli("pin-images", "--pins-file", str(pins), "--json")
    assert done.returncode == 2, done.stdout  # the file is wrong, not the registry
    assert json.loads(done.stdout)["error"].endswith("image name '127.0.0.1:9/x' has no tag")
    assert pins.read_bytes() == before


def test_head_naming_another_manifest_is_refused(hostile: tuple[Hostile, str]) -> None:
    state, name = hostile
    assert resolve(name).digest == digest(CHILD)  # the honest answer resolves
    state.head_digest = lambda ref: digest(b"another manifest")
    with pytest.raises(VerificationError, match=r"answered .* with another manifest"):
        resolve(name)


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8)
                    | st.sampled_from([digest(CHILD), "latest", "linux", "amd64"]),
                    lambda inner: st.lists(inner, max_size=3)
                    | st.dictionaries(st.sampled_from(["digest", "size", "platform", "os",
                                                       "architecture", "mediaType"]),
                                      inner, max_size=4), max_leaves=12)


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(manifests=JSON)
def test_any_index_gives_a_sha256_pin_or_one_typed_error(
        manifests: Any, hostile: tuple[Hostile, str]) -> None:
    state, name = hostile
    state.tag_body = index(manifests)
    try:
        found = resolve(name)
    except VerificationError:  # malformed
        return
    except SourceError as exc:  # well formed, but without the platform or its manifest
        assert "without linux/amd64" in exc.cause or "HTTP 404" in exc.cause, exc.cause
        return
    assert DIGEST.fullmatch(found.digest) and DIGEST.fullmatch(found.index_digest)
