"""Smoke stage: the artifacts tested before anything is published.

* :mod:`~builder.smoke.static` -- the static smoke test of a built image, no GPU: the
  provenance and the patched lines read inside the image.
* :mod:`~builder.smoke.gpu` -- the smoke test on a GPU runner, checks 1-6, in this Python
  environment (host mode) or inside the image (image mode):
  :func:`~builder.smoke.gpu.run_smoke`.
* :mod:`~builder.smoke.probe` -- the script those checks run inside the tested
  environment (standard library only: it runs where the builder is not installed).
* :mod:`~builder.smoke.container` -- running the probe in the image with every GPU.
* :mod:`~builder.smoke.server` -- check 6: a real SGLang server started and asked for text.
"""

from builder.smoke.gpu import SmokeOptions, SmokeReport, run_smoke

__all__ = ["SmokeOptions", "SmokeReport", "run_smoke"]
