"""Everything a run needs, parsed once from the command line, and the target it selects.

Every stage's ``run_*`` function takes :class:`Options`; :func:`select_target` reads the
targets file once per run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from builder.core.cache import Cache, default_cache_root
from builder.core.config import SourceKind, Target, load_targets
from builder.core.errors import ConfigurationError
from builder.core.pipconfig import IndexChoice, resolve_index
from builder.core.progress import Reporter

TARGETS_FILE = "targets.toml"


def find_targets_file(start: Path | None = None) -> Path:
    """The project's targets file: ``targets.toml`` in ``start`` or the nearest folder above.

    So the commands work from any folder inside the project (like git finding its
    repository, or pip finding ``pyproject.toml``).

    Args:
        start: where to begin (default: the current folder).

    Returns:
        The absolute path of the first ``targets.toml`` found going up.

    Raises:
        BuilderError: no folder from ``start`` up to the filesystem root has one.
    """
    here = (start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        candidate = folder / TARGETS_FILE
        if candidate.is_file():
            return candidate
    raise ConfigurationError(f"no {TARGETS_FILE} in {here} or any folder above it",
                             "run inside the project (a clone of sglang-sm120-builder), or pass "
                             "--targets-file PATH")


@dataclass(frozen=True)
class Options:
    """Everything a run needs, parsed once.

    Attributes:
        targets_file: the targets file.
        target: the target's name (``None``: the default target).
        cache_dir: the cache root.
        index_url: simple index to find sdists on (``--index-url``); ``None``: the one
            pip is configured with (see :attr:`index`).
        source: ``sdist`` or ``git`` (``None``: the target's preference).
        git_url: replacement URL or path for the target's git pin.
        source_dir: an existing tree to use instead of fetching.
        upstream_version: the version of ``source_dir`` when it has no PKG-INFO.
        series: a series file replacing the target's.
        patch: a single patch replacing the target's series (ad hoc, unpinned).
        strip: strip level for ``patch``.
        max_fuzz: fuzz allowed for ``patch``.
        dist_dir: where wheels go.
        reporter: progress output.
    """

    targets_file: Path = Path("targets.toml")
    target: str | None = None
    cache_dir: Path = field(default_factory=default_cache_root)
    index_url: str | None = None
    source: SourceKind | None = None
    git_url: str | None = None
    source_dir: Path | None = None
    upstream_version: str | None = None
    series: Path | None = None
    patch: Path | None = None
    strip: int = 1
    max_fuzz: int = 0
    dist_dir: Path = Path("dist")
    reporter: Reporter = field(default_factory=lambda: Reporter(quiet=True))

    @property
    def index(self) -> IndexChoice:
        """The index this run uses and where the choice came from (asks pip lazily)."""
        return resolve_index(self.index_url)

    @property
    def cache(self) -> Cache:
        """The cache at ``cache_dir``."""
        return Cache(self.cache_dir)


def select_target(options: Options) -> Target:
    """Return the selected target from the targets file.

    Raises:
        BuilderError: the targets file is invalid or has no such target.
    """
    return load_targets(options.targets_file).get(options.target)
