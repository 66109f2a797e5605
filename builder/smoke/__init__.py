"""Smoke stage: the artifacts tested before anything is published.

* :mod:`~builder.smoke.static` -- the static smoke test of a built image, no GPU: the
  provenance and the patched lines read inside the image.
* :mod:`~builder.smoke.gpu` -- the smoke test on a GPU runner, checks 1-6, in this Python
  environment (host mode) or inside the image (image mode):
  :func:`~builder.smoke.gpu.run_smoke`.
* ``builder/smoke/script/`` -- what runs inside the tested environment, by path, with its
  interpreter (never imported by the builder): ``smoke_probe.py`` (checks 1-5), beside
  links to the two standard-library modules it loads (``sm120_arch.py`` is
  :mod:`builder.core.arch`, ``smoke_shared.py`` is :mod:`~builder.smoke.shared`), and
  ``tiny_model.py`` (check 6's model).
* :mod:`~builder.smoke.shared` -- what both sides read: the probe's typed results
  (:class:`~builder.smoke.shared.ProbeResults`), FlashInfer's log rules, the manifest.
* :mod:`~builder.smoke.container` -- running the probe in the image with every GPU.
* :mod:`~builder.smoke.server` -- check 6: a real SGLang server started and asked for text.
* :mod:`~builder.smoke.warm_cache` -- FlashInfer's autotune file captured with the key it is
  valid for, and restored only for that key (issue 27; no CLI command yet).
"""

from builder.smoke.gpu import SmokeOptions, SmokeReport, run_smoke

__all__ = ["SmokeOptions", "SmokeReport", "run_smoke"]
