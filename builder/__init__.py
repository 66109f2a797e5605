"""Build patched SGLang wheels for SM120 from pinned upstream releases.

The pipeline's stages, one package each, each returning one result object the next takes::

    source ──► patching ──► wheel ───────────┐
                  │                          ├─► image ──► smoke ──► release
                  └──► kernels ──────────────┘

    run_fetch -> run_patch -> run_wheels -----------> run_image -> run_smoke -> run_release
    (SourceResult) (PatchResult) (WheelResult)    /   (ImageResult) (SmokeReport) (ReleaseSummary)
                           run_kernels ----------/
                           (KernelResult: a flashinfer_jit_cache wheel)

Each ``run_*`` function (:func:`run_fetch`, :func:`run_patch`, :func:`run_wheels`, ...)
runs its stage for a target of the targets file, read by
:func:`load_targets` into :class:`Target` s and selected by an :class:`Options`; a stage
with options of its own takes them from its package (``builder.kernels.KernelOptions``,
``builder.image.ImageOptions``, ``builder.smoke.SmokeOptions``, and
``builder.release.Index`` for where a release goes). Every refusal raises a
:class:`BuilderError` with a cause and a hint; its subclasses say who has to act
(:class:`VerificationError`, :class:`ConfigurationError`, :class:`MissingToolError`,
:class:`SourceError`, :class:`PatchError`, :class:`BuildError`, :class:`PublishError`; see
:mod:`builder.core.errors`). Everything else is private to its stage and imported from the
module that defines it (``from builder.patching.hunks import split_lines``).
:mod:`builder.targets` holds the targets file's commands (the CI plan, the upstream check,
pinning a release, the lock); :mod:`builder.cli` is the command line.

The public names are declared once, by the ``if TYPE_CHECKING:`` imports at the end of this
file, written ``import X as X`` (the explicit re-export form strict mypy and pyright read).
Type checkers see exactly those names and their real types. At run time nothing is
imported with the package: the first lookup of a public name reads that same block from
this file's source (``_public``, parsed once) and imports only the module the name
comes from (PEP 562 ``__getattr__``), so ``import builder`` stays cheap and a user of one
stage does not load the others. ``__all__`` and ``dir(builder)`` come from the same block.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

_names: dict[str, str] | None = None


def _public() -> dict[str, str]:
    """Public name -> the module that defines it, read from the ``TYPE_CHECKING`` block.

    Raises:
        ImportError: this file's source cannot be read or has no such block.
    """
    global _names
    if _names is None:
        import ast

        with open(__file__, encoding="utf-8") as source:
            tree = ast.parse(source.read())
        blocks = [node for node in tree.body if isinstance(node, ast.If)
                  and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"]
        if len(blocks) != 1:
            raise ImportError(f"{__file__}: expected one `if TYPE_CHECKING:` block of the "
                              f"public names, found {len(blocks)}")
        _names = {alias.asname or alias.name: node.module
                  for node in blocks[0].body
                  if isinstance(node, ast.ImportFrom) and node.module
                  for alias in node.names}
    return _names


if not TYPE_CHECKING:  # hidden from type checkers, so a misspelt name is their error
    def __getattr__(name: str) -> Any:
        """Import a public name's module on first use (PEP 562).

        Raises:
            AttributeError: ``name`` is not public.
        """
        if name == "__all__":
            value: Any = sorted(_public())
        elif name.startswith("__") or name not in _public():
            raise AttributeError(f"module 'builder' has no attribute {name!r}")
        else:
            import importlib

            value = getattr(importlib.import_module(_public()[name]), name)
        globals()[name] = value
        return value

    def __dir__() -> list[str]:
        """The public names (what ``from builder import *`` binds)."""
        return sorted(_public())


if TYPE_CHECKING:  # the public names, declared here only (see the module docstring)
    from builder.core.config import Target as Target
    from builder.core.config import load_targets as load_targets
    from builder.core.errors import BuilderError as BuilderError
    from builder.core.errors import BuildError as BuildError
    from builder.core.errors import ConfigurationError as ConfigurationError
    from builder.core.errors import MissingToolError as MissingToolError
    from builder.core.errors import PatchError as PatchError
    from builder.core.errors import PublishError as PublishError
    from builder.core.errors import SourceError as SourceError
    from builder.core.errors import VerificationError as VerificationError
    from builder.core.options import Options as Options
    from builder.image.build import ImageResult as ImageResult
    from builder.image.run import run_image as run_image
    from builder.kernels.build import KernelResult as KernelResult
    from builder.kernels.run import run_kernels as run_kernels
    from builder.patching.apply import PatchResult as PatchResult
    from builder.patching.apply import run_patch as run_patch
    from builder.release.run import ReleaseSummary as ReleaseSummary
    from builder.release.run import run_release as run_release
    from builder.smoke.gpu import SmokeReport as SmokeReport
    from builder.smoke.gpu import run_smoke as run_smoke
    from builder.source.fetch import SourceResult as SourceResult
    from builder.source.fetch import run_fetch as run_fetch
    from builder.wheel.build import WheelResult as WheelResult
    from builder.wheel.build import run_wheels as run_wheels
