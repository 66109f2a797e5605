"""Griffe extension: Sphinx cross-reference roles in the docstrings as links on the site.

The builder's docstrings are Google style with Sphinx roles (``:func:`run_fetch```,
``:class:`~builder.core.errors.BuilderError```), which Markdown would print as
``:func:`` followed by code. This extension rewrites each role, once the package is
loaded, into a mkdocs-autorefs cross-reference to the object's page
(``[`run_fetch`][builder.source.fetch.run_fetch]``), resolving a short name in the scope
of the docstring's object as Python would. A leading ``~`` shows only the last part of the
name, as in Sphinx.

A role whose name resolves to nothing in the package is logged as a warning, so
``mkdocs build --strict`` fails on it as on any broken link; a name outside the package
(a built-in, the standard library's, a dependency's) and a private name (one the reference
pages do not render) become plain code.

Loaded by mkdocstrings-python from ``mkdocs.yml`` (``extensions: [docs/_ext/sphinx_roles.py]``);
the format of the roles is Sphinx's Python domain
(https://www.sphinx-doc.org/en/master/usage/domains/python.html#cross-referencing-python-objects).
"""

from __future__ import annotations

import builtins
import re
from collections.abc import Iterator
from typing import Any

import griffe

#: ``:role:`target``` or ``:py:role:`~target```; the roles of Sphinx's Python domain.
_ROLE = re.compile(
    r":(?:py:)?(?P<role>func|meth|class|mod|data|attr|exc|obj|const|type):"
    r"`(?P<short>~?)(?P<target>[A-Za-z_][\w.]*)(?P<call>\(\))?`")

_logger = griffe.get_logger("sphinx_roles")


class SphinxRoles(griffe.Extension):
    """Rewrite Sphinx roles into autorefs cross-references once a package is loaded."""

    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader,
                   **kwargs: Any) -> None:
        """Rewrite the roles in every docstring of ``pkg`` (aliases are skipped: their
        targets are rewritten where they are defined).

        Args:
            pkg: The loaded package.
            loader: The loader, whose modules collection resolves dotted names.
            **kwargs: Unused (griffe's forward compatibility).
        """
        for obj in _objects(pkg):
            if obj.docstring is not None:
                obj.docstring.value = _rewrite(obj.docstring.value, obj, pkg, loader)


def _objects(obj: griffe.Object) -> Iterator[griffe.Object]:
    yield obj
    for member in obj.members.values():
        if not member.is_alias:
            yield from _objects(member)  # type: ignore[arg-type]


def _rewrite(text: str, obj: griffe.Object, pkg: griffe.Module,
             loader: griffe.GriffeLoader) -> str:
    return _ROLE.sub(lambda match: _link(match, obj, pkg, loader), text)


def _link(match: re.Match[str], obj: griffe.Object, pkg: griffe.Module,
          loader: griffe.GriffeLoader) -> str:
    target, call = match["target"], match["call"] or ""
    shown = (target.rsplit(".", 1)[-1] if match["short"] else target) + call
    path = _resolve(target, obj, loader)
    if path is None:
        # a built-in (:exc:`OSError`) or another package's name is shown as code
        if not hasattr(builtins, target) and (
                target.split(".", 1)[0] == pkg.name or "." not in target):
            _logger.warning("%s: %s names nothing in %s", obj.path, match[0], pkg.name)
        return f"`{shown}`"
    if path.split(".", 1)[0] != pkg.name or _private(path):
        return f"`{shown}`"
    return f"[`{shown}`][{path}]"


def _resolve(target: str, obj: griffe.Object, loader: griffe.GriffeLoader) -> str | None:
    """The full path of ``target`` as seen from ``obj``, or None."""
    head, _, rest = target.partition(".")
    try:
        found = loader.modules_collection[target]
    except KeyError:
        try:
            base = obj.resolve(head)
        except griffe.NameResolutionError:
            return None
        if not rest:
            return base
        try:
            found = loader.modules_collection[f"{base}.{rest}"]
        except KeyError:
            return None
    path: str = found.target_path if found.is_alias else found.path
    return path


def _private(path: str) -> bool:
    return any(part.startswith("_") and not part.startswith("__")
               for part in path.split("."))
