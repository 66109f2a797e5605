"""What every stage shares: configuration, options, cache, layout, progress and errors.

* :mod:`builder.core.config` -- ``targets.toml`` parsed once into typed objects.
* :mod:`builder.core.options` -- :class:`~builder.core.options.Options`, what a run needs.
* :mod:`builder.core.cache` -- the content-addressed cache, written atomically.
* :mod:`builder.core.layout` -- repository paths vs the sdist's and wheel's layouts.
* :mod:`builder.core.progress` -- progress on stderr, results on stdout.
* :mod:`builder.core.errors` -- :class:`~builder.core.errors.BuilderError`.
* :mod:`builder.core.address` -- the one parser of URLs and ``HOST[:PORT]`` (ports
  1-65535, no credentials).
* :mod:`builder.core.wheelmeta` -- the one reader of a wheel's ``Requires-Dist``.
* :mod:`builder.core.arch` -- the SM120 arch strings and FlashInfer's arch rule.
* :mod:`builder.core.engine` -- the Docker Engine client the kernel, image, smoke and
  release stages share (imported only by them: it loads docker-py).

The core imports no stage.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from builder.core.cache import Cache, default_cache_root
    from builder.core.config import Target, TargetsFile, load_targets
    from builder.core.errors import BuilderError
    from builder.core.layout import Layout
    from builder.core.options import Options, select_target
    from builder.core.progress import Reporter

# Each name's module, imported on first use (PEP 562): a command that needs only the
# errors or the options does not load the cache, tomlkit or rich.
_HOME = {"Cache": "cache", "default_cache_root": "cache", "Target": "config",
         "TargetsFile": "config", "load_targets": "config", "BuilderError": "errors",
         "Layout": "layout", "Options": "options", "select_target": "options",
         "Reporter": "progress"}
__all__ = sorted(_HOME)


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module 'builder.core' has no attribute {name!r}")
    return getattr(importlib.import_module(f"builder.core.{_HOME[name]}"), name)


def __dir__() -> list[str]:
    return __all__
