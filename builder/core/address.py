"""Addresses: the one parser of every URL and ``HOST[:PORT]`` the builder is given.

One rule for all of them: the scheme is one the caller names, a network address has a
host, a port is a whole number from 1 to 65535 (urllib accepts 0 and reads the range only
when asked), and credentials are refused where the tool that gets the address cannot use
them (the publish index: twine reads ``TWINE_*``; the Docker Engine). The exceptions: an
``ssh://USER@HOST`` engine address, where USER is the login name ssh uses (not a secret;
a password is refused there too), and a package index, where pip documents
``https://USER:TOKEN@HOST/simple`` and uses it (``credentials=True``).

Wherever an address is printed -- progress, errors, ``--help``, ``--json`` -- it goes
through :func:`redact` first, which shows a password as ``****`` as pip does.

The other modules read URLs only through these functions (``tests/test_architecture.py``
checks that no other module calls ``urllib.parse.urlsplit`` or ``urlparse``).
"""

from __future__ import annotations

import re
import urllib.parse
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
#: ``scheme://USERINFO@`` anywhere in a text; USERINFO runs to the netloc's last ``@`` (as
#: urllib's ``rpartition``), never past a ``/``, ``?``, ``#``, a space or a quote.
_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)(?P<userinfo>[^\s/?#'\"<>`]*)@")
#: Schemes whose lone user name is a login name, not a token: kept when printed.
_LOGIN_SCHEMES = frozenset({"ssh", "git+ssh", "ssh+git"})
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


def redact(text: str) -> str:
    """``text`` with the credentials of every address in it shown as ``****``: the
    password of ``USER:PASSWORD@`` (``https://alice:****@host/simple``), and a lone user
    name (``****@host``: an access token is often written that way), as pip prints index
    URLs (``redact_auth_from_url`` / ``redact_netloc`` in ``pip._internal.utils.misc``,
    pip 26.3). An ``ssh://`` login name without a password is kept (it is not a secret).

    Args:
        text: a URL, or any text that may hold URLs (a message, a JSON document).

    Returns:
        The text with nothing else changed (an address without credentials is kept).
    """
    def hide(match: re.Match[str]) -> str:
        user, colon, _ = match.group("userinfo").partition(":")
        scheme = match.group("scheme")[:-3].lower()
        if colon:
            return f"{match.group('scheme')}{user}:****@"
        if scheme in _LOGIN_SCHEMES:
            return match.group(0)
        return f"{match.group('scheme')}****@"

    return _USERINFO.sub(hide, text) if "@" in text else text


def _port(text: str, value: str | None, what: str, hint: str) -> int | None:
    """A written port, range-checked.

    Raises:
        ConfigurationError: not a number from 1 to 65535.
    """
    if value is None or value == "":
        return None
    if not value.isascii() or not value.isdigit() or int(value) not in PORTS:
        raise ConfigurationError(f"{what}{redact(text)!r}: port {value} is outside 1-65535",
                                 hint)
    return int(value)


def parse_url(text: str, schemes: Collection[str], *, noun: str, hint: str,
              what: str = "", ssh_user: bool = False, credentials: bool = False,
              credentials_hint: str = _CREDENTIALS_HINT) -> Address:
    """Check and split a URL.

    Args:
        text: the URL as the user gave it.
        schemes: the schemes accepted; ``file`` and ``unix`` take a path and no host, the
            others need a host.
        noun: what it must be, for the message ("an http(s) URL").
        hint: how to write one.
        what: the flag or variable it came from, with a trailing space ("" for none).
        ssh_user: accept a login name (never a password) in an ``ssh://`` address.
        credentials: accept ``USER[:PASSWORD]@`` (a package index: pip uses them); the
            messages show them redacted all the same.
        credentials_hint: where the tool that gets the address takes its credentials
            instead (default: the publish index's: ``~/.netrc``, ``TWINE_*``, keyring).

    Returns:
        The address, split (``text`` unchanged).

    Raises:
        ConfigurationError: another scheme, a NUL, no host where one is needed, a port
            outside 1-65535, a query or fragment (not shown), or credentials in the
            address (unless ``credentials``); the message shows the address through
            :func:`redact`.
    """
    shown = redact(text)
    try:
        parts = urllib.parse.urlsplit(text)
    except ValueError:  # an unbalanced "[" of an IPv6 host
        raise ConfigurationError(f"{what}{shown!r} is not {noun}", hint) from None
    scheme = parts.scheme.lower()
    if scheme not in schemes or "\0" in text or "://" not in text:
        raise ConfigurationError(f"{what}{shown!r} is not {noun}", hint)
    if (parts.query or parts.fragment or text.endswith(("?", "#"))) and scheme != "unix":
        # None of these addresses takes one: an index's project path (PEP 503) would land
        # after it, and a token in it would be printed (redact hides userinfo alone).
        bare = redact(urllib.parse.urlunsplit(parts._replace(query="", fragment="")))
        raise ConfigurationError(f"{what}{bare!r} carries a query or fragment (?... or #...; "
                                 "not shown)", "give the address without it; an index "
                                 "takes credentials as USER:PASSWORD@ (pip's form) or from "
                                 "a keyring")
    if scheme == "unix":
        if not text.partition("://")[2].startswith("/"):
            raise ConfigurationError(f"{what}{shown!r}: the socket must be an absolute path",
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
        raise ConfigurationError(f"{what}{shown!r} names no host", hint)
    if not credentials and (parts.password is not None or (
            parts.username is not None and not (ssh_user and scheme == "ssh"))):
        raise ConfigurationError(f"{what}the address {shown!r} carries credentials",
                                 credentials_hint)
    return Address(text, scheme, parts.hostname, port, parts.path,
                   parts.username if scheme == "ssh" else None)


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
    import urllib.request  # slow to import; progress output needs only redact()

    return Path(urllib.request.url2pathname(urllib.parse.urlparse(url).path))


def file_name(url: str) -> str:
    """The last path segment of a URL, percent-escapes decoded (a download's file name)."""
    return urllib.parse.unquote(urllib.parse.urlparse(url).path.rsplit("/", 1)[-1])
