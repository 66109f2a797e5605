"""Addresses: the one parser of every URL and ``HOST[:PORT]`` the builder is given.

One rule for all of them: the scheme is one the caller names, a network address has a
host, a port is a whole number from 1 to 65535 (urllib accepts 0 and reads the range only
when asked), and credentials are never part of an address -- they would be printed in
messages, logs and reports. The one exception is an ``ssh://USER@HOST`` engine address,
where USER is the login name ssh uses (not a secret); a password is refused there too.

The other modules read URLs only through these functions (``tests/test_architecture.py``
checks that no other module calls ``urllib.parse.urlsplit`` or ``urlparse``).
"""

from __future__ import annotations

import re
import urllib.parse
import urllib.request
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from builder.core.errors import ConfigurationError

# The domain of the distribution project's reference grammar (reference/regexp.go,
# distribution 2.8): dot-separated components, or an IPv6 address in brackets, with an
# optional port.
_DOMAIN_PART = r"(?:[A-Za-z0-9]|[A-Za-z0-9][A-Za-z0-9-]*[A-Za-z0-9])"
_HOST_PORT = re.compile(rf"^(?:{_DOMAIN_PART}(?:\.{_DOMAIN_PART})*|\[[0-9A-Fa-f:.]+\])"
                        r"(?::(?P<port>[0-9]{1,5}))?$")
PORTS = range(1, 65536)
_CREDENTIALS_HINT = ("put them in ~/.netrc, TWINE_USERNAME / TWINE_PASSWORD or the "
                     "keyring instead, so they are never printed")


@dataclass(frozen=True)
class Address:
    """A checked address, split.

    Attributes:
        text: the address as given (what the builder passes on, unchanged).
        scheme: its scheme, lower-case (``""`` for a ``HOST[:PORT]``).
        host: the host (``""`` for ``file://`` and ``unix://``).
        port: the port, ``None`` when none is written.
        path: the path part.
        user: the login name of an ``ssh://`` address (``None`` when none is written).
    """

    text: str
    scheme: str
    host: str
    port: int | None
    path: str
    user: str | None = None


def _port(text: str, value: str | None, what: str, hint: str) -> int | None:
    """A written port, range-checked.

    Raises:
        ConfigurationError: not a number from 1 to 65535.
    """
    if value is None or value == "":
        return None
    if not value.isascii() or not value.isdigit() or int(value) not in PORTS:
        raise ConfigurationError(f"{what}{text!r}: port {value} is outside 1-65535", hint)
    return int(value)


def parse_url(text: str, schemes: Collection[str], *, noun: str, hint: str,
              what: str = "", ssh_user: bool = False) -> Address:
    """Check and split a URL.

    Args:
        text: the URL as the user gave it.
        schemes: the schemes accepted; ``file`` and ``unix`` take a path and no host, the
            others need a host.
        noun: what it must be, for the message ("an http(s) URL").
        hint: how to write one.
        what: the flag or variable it came from, with a trailing space ("" for none).
        ssh_user: accept a login name (never a password) in an ``ssh://`` address.

    Returns:
        The address, split (``text`` unchanged).

    Raises:
        ConfigurationError: another scheme, a NUL, no host where one is needed, a port
            outside 1-65535, or credentials in the address.
    """
    try:
        parts = urllib.parse.urlsplit(text)
    except ValueError:  # an unbalanced "[" of an IPv6 host
        raise ConfigurationError(f"{what}{text!r} is not {noun}", hint) from None
    scheme = parts.scheme.lower()
    if scheme not in schemes or "\0" in text or "://" not in text:
        raise ConfigurationError(f"{what}{text!r} is not {noun}", hint)
    if scheme == "unix":
        if not text.partition("://")[2].startswith("/"):
            raise ConfigurationError(f"{what}{text!r}: the socket must be an absolute path",
                                     hint)
        return Address(text, scheme, "", None, text.partition("://")[2])
    if scheme == "file":
        return Address(text, scheme, "", None, parts.path)
    netloc_host = parts.netloc.rpartition("@")[2]
    written_port = None
    if not netloc_host.endswith("]") and ":" in netloc_host:
        written_port = netloc_host.rpartition(":")[2]
    port = _port(text, written_port, what, hint)
    if not parts.hostname:
        raise ConfigurationError(f"{what}{text!r} names no host", hint)
    if parts.password is not None or (parts.username is not None and
                                      not (ssh_user and scheme == "ssh")):
        raise ConfigurationError(f"{what}the address {_without_credentials(parts)!r} "
                                 "carries credentials", _CREDENTIALS_HINT)
    return Address(text, scheme, parts.hostname, port, parts.path,
                   parts.username if scheme == "ssh" else None)


def _without_credentials(parts: urllib.parse.SplitResult) -> str:
    """The URL with its user and password left out (for a message that must not show them)."""
    host = parts.netloc.rpartition("@")[2]
    return urllib.parse.urlunsplit(parts._replace(netloc=host))


def parse_host_port(text: str, *, noun: str, hint: str) -> Address:
    """Check and split a ``HOST[:PORT]`` (a registry address): a domain or ``[IPv6]``,
    with a port from 1 to 65535 if one is given (the distribution project's reference
    grammar, reference/regexp.go, distribution 2.8).

    Args:
        text: the address as given.
        noun: what it must be, for the message ("a registry address").
        hint: how to write one.

    Returns:
        The address, split (no scheme, no path).

    Raises:
        ConfigurationError: it is not one.
    """
    match = _HOST_PORT.match(text)
    if not match:
        raise ConfigurationError(f"{text!r} is not {noun}", hint)
    port = _port(text, match.group("port"), "", hint)
    host = text[:match.start("port") - 1] if match.group("port") is not None else text
    return Address(text, "", host, port, "")


def scheme(url: str) -> str:
    """The scheme of a URL the builder already accepted (a download or index page link),
    lower-case (``""`` when none)."""
    return urllib.parse.urlparse(url).scheme.lower()


def local_path(url: str) -> Path:
    """The file a ``file://`` URL names (percent-escapes decoded, as pip reads it)."""
    return Path(urllib.request.url2pathname(urllib.parse.urlparse(url).path))


def file_name(url: str) -> str:
    """The last path segment of a URL, percent-escapes decoded (a download's file name)."""
    return urllib.parse.unquote(urllib.parse.urlparse(url).path.rsplit("/", 1)[-1])
