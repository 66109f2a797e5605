"""What every stage shares: configuration, options, cache, layout, progress and errors.

* :mod:`builder.core.config` -- ``targets.toml`` parsed once into typed objects.
* :mod:`builder.core.options` -- :class:`~builder.core.options.Options`, what a run needs.
* :mod:`builder.core.cache` -- the content-addressed cache, written atomically.
* :mod:`builder.core.layout` -- repository paths vs the sdist's and wheel's layouts.
* :mod:`builder.core.progress` -- progress on stderr, results on stdout.
* :mod:`builder.core.errors` -- :class:`~builder.core.errors.BuilderError`.
* :mod:`builder.core.engine` -- the Docker Engine client the kernel, image, smoke and
  release stages share (imported only by them: it loads docker-py).

The core imports no stage.
"""

from builder.core.cache import Cache, default_cache_root
from builder.core.config import Target, TargetsFile, load_targets
from builder.core.errors import BuilderError
from builder.core.layout import Layout
from builder.core.options import Options, select_target
from builder.core.progress import Reporter

__all__ = ["BuilderError", "Cache", "Layout", "Options", "Reporter", "Target", "TargetsFile",
           "default_cache_root", "load_targets", "select_target"]
