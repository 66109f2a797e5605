"""The static smoke test's reader: runs inside the image (``python3 -c``), standard
library only, and prints what is installed there as one JSON object.

Its input is the JSON in ``SM120_SMOKE`` (:func:`builder.smoke.static.static_smoke`
writes it): ``dists`` (distributions to find), ``provenance_file``, ``lines`` (``path``
and ``line`` of each patched line), ``profile``, ``launcher`` and ``launcher_args``.
"""

import hashlib
import importlib.metadata as md
import json
import os
import subprocess
from pathlib import Path
from typing import Any

spec = json.loads(os.environ["SM120_SMOKE"])
out: dict[str, Any] = {"dists": {}, "lines": [], "provenance": None, "wheel_tags": [],
       "profile_sha256": None, "launcher": None}
try:
    with open(spec["profile"], "rb") as handle:
        out["profile_sha256"] = hashlib.sha256(handle.read()).hexdigest()
except OSError:
    pass
if os.access(spec["launcher"], os.X_OK):
    done = subprocess.run([spec["launcher"], *spec["launcher_args"]], capture_output=True,
                          text=True, env={**os.environ, "SGLANG_SM120_DRY_RUN": "1"})
    out["launcher"] = {"status": done.returncode, "stdout": done.stdout,
                       "stderr": done.stderr[-2000:]}
for name in spec["dists"]:
    try:
        dist = md.distribution(name)
    except md.PackageNotFoundError:
        out["dists"][name] = None
        continue
    size = 0
    for item in dist.files or ():
        path = Path(item.locate())
        if path.is_file():
            size += path.stat().st_size
    out["dists"][name] = {"version": dist.version, "installed_size": size}
sglang: md.Distribution | None
try:
    sglang = md.distribution("sglang")
except md.PackageNotFoundError:
    sglang = None
if sglang is not None:
    text = sglang.read_text(spec["provenance_file"])
    out["provenance"] = json.loads(text) if text else None
    out["wheel_tags"] = [line.split(":", 1)[1].strip()
                         for line in (sglang.read_text("WHEEL") or "").splitlines()
                         if line.startswith("Tag:")]
    for item in spec["lines"]:
        path = Path(str(sglang.locate_file(item["path"])))
        lines = path.read_text(encoding="utf-8").splitlines() if path.is_file() else []
        number = item["line"]
        out["lines"].append(lines[number - 1] if 0 < number <= len(lines) else None)
print(json.dumps(out))
