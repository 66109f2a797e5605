"""Benchmark the runtime image: the layer we add against what it carries, and a rebuild.

Measured in one run on one machine, on a private Docker Engine and registry started here
(tests/helpers/services.py) and the tests' Debian base (debootstrap, cached in .cache/tests):

* layer ratio: the one layer the build adds (the engine's size, and the compressed blob
  the registry stores) against the installed size of the wheels it carries (every file
  in their ``RECORD``, bytecode included, read inside the image). Goal: <= 1.05x.
* rebuild: the image built again with nothing changed (the wheel from the builder's
  cache, every step from BuildKit's cache) against the first build. Goal: cached, seconds.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the tests package (tests.helpers.services)

from builder import Options, run_wheels  # noqa: E402
from builder.image.build import BaseImage  # noqa: E402
from builder.image.run import ImageOptions, run_image  # noqa: E402
from builder.smoke.static import static_smoke  # noqa: E402
from tests.helpers.services import (  # noqa: E402
    DEBIAN_SUITE,
    debian_rootfs,
    import_image,
    push_image,
    start_docker_engine,
    start_registry,
)


def _layer_blob_size(registry: str, repository: str, digest: str) -> int:
    request = urllib.request.Request(
        f"http://{registry}/v2/{repository}/manifests/{digest}",
        headers={"Accept": "application/vnd.docker.distribution.manifest.v2+json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        manifest = json.load(response)
    return int(manifest["layers"][-1]["size"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default=None, help="target (default: the default one)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-image-"))
    engine = registry = None
    try:
        engine = start_docker_engine(work / "docker")
        registry = start_registry(work / "registry")
        tarball = debian_rootfs(ROOT / ".cache" / "tests" / "images")
        image_id = import_image(engine, tarball, "bench/debian", DEBIAN_SUITE)
        name = f"{registry.host}/bench/debian:{DEBIAN_SUITE}"
        base = BaseImage(name, push_image(engine, image_id, name))
        options = Options(targets_file=ROOT / "targets.toml", target=args.target,
                          cache_dir=work / "cache", dist_dir=work / "dist")
        run_wheels(options)  # the wheel is not what is measured
        image_options = ImageOptions(registry=registry.host, repository="bench/sglang",
                                     base_image=base.reference,
                                     pins_file=ROOT / "images" / "pins.toml",
                                     dockerfile=ROOT / "images" / "Dockerfile",
                                     profiles_dir=ROOT / "images" / "profiles")
        start = time.perf_counter()
        first = run_image(options, image_options, engine.client)
        cold_s = time.perf_counter() - start
        start = time.perf_counter()
        again = run_image(options, image_options, engine.client)
        warm_s = time.perf_counter() - start
        assert again.cached and again.image_id == first.image_id, "the rebuild was not cached"
        installed = static_smoke(engine.client, first).installed_size
        digest = push_image(engine, first.image_id, first.tags[0])
        blob = _layer_blob_size(registry.host, "bench/sglang", digest)
        wheel_bytes = sum(w.path.stat().st_size for w in first.wheels)
        result = {
            "layer_bytes": first.layer_size, "installed_bytes": installed,
            "layer_ratio": round(first.layer_size / installed, 4),
            "layer_blob_bytes": blob, "wheel_bytes": wheel_bytes,
            "blob_ratio": round(blob / installed, 4),
            "first_build_s": round(cold_s, 2), "rebuild_s": round(warm_s, 2),
            "rebuild_ratio": round(warm_s / cold_s, 4), "rebuild_cached": again.cached,
        }
    finally:
        if registry is not None:
            registry.stop()
        if engine is not None:
            engine.stop()
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"layer added: {result['layer_bytes'] / 1e6:.1f} MB vs installed "
          f"{result['installed_bytes'] / 1e6:.1f} MB = {result['layer_ratio']:.3f}x "
          "(goal <= 1.05x)")
    print(f"  as stored in the registry (gzip): {blob / 1e6:.1f} MB = "
          f"{result['blob_ratio']:.3f}x; the wheel file itself: {wheel_bytes / 1e6:.1f} MB")
    print(f"rebuild, nothing changed: {warm_s:.2f} s vs first build {cold_s:.2f} s = "
          f"{result['rebuild_ratio']:.3f}x, cached: {again.cached} (goal: cached, seconds)")


if __name__ == "__main__":
    main()
