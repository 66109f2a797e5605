"""The package index a user's pip would use, read with pip's own configuration loader.

A user behind a PyPI mirror has told pip so already (``PIP_INDEX_URL``, or ``index-url``
in a ``pip.conf`` that ``pip config`` finds: the global, user and site files and
``PIP_CONFIG_FILE``). The builder asks pip rather than re-implementing its file search:
``python -m pip config list`` in a subprocess (pip's documented command, which prints
``section.key='value'`` lines, environment variables as ``:env:.key``). Its answer is read
once per process and only when an index is needed, so commands that never touch an
index stay fast.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from dataclasses import dataclass
from functools import lru_cache

#: pip's own default index (PEP 503/691 simple API), used when pip names none.
PYPI_SIMPLE_URL = "https://pypi.org/simple"

# pip's precedence: environment variables over the config files; within the files a
# command's own section (``install``, ``download``) over ``global`` (pip's "Configuration"
# documentation). The builder downloads, so ``download`` ranks next to ``install``.
_PRECEDENCE = (":env:.index-url", "download.index-url", "install.index-url",
               "global.index-url")


@dataclass(frozen=True)
class IndexChoice:
    """The index a run uses and where that choice came from.

    Attributes:
        url: the simple index's root URL, as given: the downloads use it, credentials
            (``https://USER:TOKEN@host/simple``) included, as pip does.
        origin: ``--index-url``, ``PIP_INDEX_URL``, ``pip config (global.index-url)``,
            or ``pip's default``.
    """

    url: str
    origin: str

    @property
    def shown(self) -> str:
        """:attr:`url` as it may be printed (:func:`builder.core.address.redact`)."""
        from builder.core.address import redact

        return redact(self.url)

    def describe(self) -> dict[str, str]:
        """Return JSON-ready data (the URL redacted)."""
        return {"url": self.shown, "origin": self.origin}

    def __str__(self) -> str:
        return f"{self.shown} (from {self.origin})"


def parse_config_list(text: str) -> IndexChoice:
    """Pick the index from ``pip config list`` output.

    Args:
        text: pip's output, one ``section.key='value'`` line per setting.

    Returns:
        The highest-precedence ``index-url``, else PyPI.
    """
    found: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if not sep:
            continue
        try:
            found[key.strip()] = str(ast.literal_eval(value.strip()))
        except (ValueError, SyntaxError):
            found[key.strip()] = value.strip().strip("'\"")
    for key in _PRECEDENCE:
        if found.get(key):
            origin = "PIP_INDEX_URL" if key.startswith(":env:") else f"pip config ({key})"
            return IndexChoice(found[key].split()[0], origin)
    return IndexChoice(PYPI_SIMPLE_URL, "pip's default")


@lru_cache(maxsize=1)
def pip_index() -> IndexChoice:
    """The index pip would use here (its configuration, else PyPI).

    Runs ``python -m pip config list`` with this interpreter once per process. Without
    pip, or when pip fails, ``PIP_INDEX_URL`` alone is honoured.

    Returns:
        The choice and its origin.
    """
    try:
        done = subprocess.run([sys.executable, "-m", "pip", "config", "list"],
                              capture_output=True, text=True, timeout=60, check=False,
                              env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
    except (OSError, subprocess.TimeoutExpired):
        done = None
    if done is not None and done.returncode == 0:
        return parse_config_list(done.stdout)
    env = os.environ.get("PIP_INDEX_URL")
    if env:
        return IndexChoice(env.split()[0], "PIP_INDEX_URL")
    return IndexChoice(PYPI_SIMPLE_URL, "pip's default (pip config could not be read)")


def resolve_index(given: str | None) -> IndexChoice:
    """``--index-url`` when given, else pip's configured index, checked by the rule of
    every address (:func:`builder.core.address.parse_url`; credentials allowed, as pip
    uses them) before any request.

    Args:
        given: the command line's ``--index-url`` (``None`` when absent; argparse
            checked it already).

    Returns:
        The index to use and where it came from.

    Raises:
        ConfigurationError: pip's configured index is not an http(s):// or file:// URL
            with a host and a port from 1 to 65535 (the message names where it was set).
    """
    if given:
        return IndexChoice(given, "--index-url")
    choice = pip_index()
    check_index_url(choice.url, choice.origin)
    return choice


def check_index_url(url: str, origin: str) -> str:
    """``url`` if it is a package index's address: ``http(s)://`` with a host and a port
    from 1 to 65535, or ``file://`` (pip takes both); credentials are allowed.

    Args:
        url: the address.
        origin: where it was set (``--index-url``, ``PIP_INDEX_URL``, ``pip config
            (global.index-url)``), for the message.

    Returns:
        ``url`` unchanged.

    Raises:
        ConfigurationError: it is not one (the message shows it redacted).
    """
    from builder.core.address import parse_url

    hint = "" if origin == "--index-url" else \
        f"fix {origin} (pip reads it too), or pass --index-url URL"
    where = "" if origin == "--index-url" else f"{origin} "
    return parse_url(url, ("http", "https", "file"), noun="an http(s):// or file:// URL",
                     hint=hint, what=where, credentials=True).text
