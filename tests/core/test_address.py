"""builder.core.address: one rule for every URL and HOST[:PORT] (ports 1-65535, never a
credential), whichever flag it came from."""

from __future__ import annotations

import pytest

from builder.core.address import parse_host_port, parse_url
from builder.core.engine import check_docker_host
from builder.core.errors import ConfigurationError
from builder.image.registry import check_registry
from builder.release.publish import Index

HTTP = ("http", "https")


@pytest.mark.parametrize(("text", "message"), [
    ("notaurl", "is not an http(s) URL"),
    ("ftp://host/simple/", "is not an http(s) URL"),
    ("http:///simple/", "names no host"),
    ("http://host:0/", "port 0 is outside 1-65535"),
    ("http://host:65536/", "port 65536 is outside 1-65535"),
    ("http://host:x/", "port x is outside 1-65535"),
    ("http://u:secret@host/", "carries credentials"),
    ("http://u@host/", "carries credentials"),
])
def test_a_url_outside_the_rule_is_refused(text: str, message: str) -> None:
    with pytest.raises(ConfigurationError) as refused:
        parse_url(text, HTTP, noun="an http(s) URL", hint="h")
    assert message in refused.value.cause
    assert "secret" not in refused.value.cause  # a credential is never printed


def test_a_url_is_split_and_passed_on_unchanged() -> None:
    address = parse_url("https://[::1]:8443/simple/", HTTP, noun="n", hint="h")
    assert (address.text, address.host, address.port, address.path) == (
        "https://[::1]:8443/simple/", "::1", 8443, "/simple/")
    assert parse_url("http://host/", HTTP, noun="n", hint="h").port is None


@pytest.mark.parametrize("text", ["ghcr.io", "localhost:5000", "[::1]:5000", "a.b-c.d:65535"])
def test_a_registry_host_port_is_accepted(text: str) -> None:
    assert check_registry(text) == text


@pytest.mark.parametrize("text", ["localhost:0", "localhost:65536", "-x.io", "a b", "host:"])
def test_a_registry_host_port_outside_the_rule_is_refused(text: str) -> None:
    with pytest.raises(ConfigurationError):
        parse_host_port(text, noun="a registry address", hint="h")


def test_every_flag_reads_the_same_port_and_credential_rule() -> None:
    """The index, the engine and the registry answer the same input the same way."""
    for port in ("0", "65536"):
        with pytest.raises(ConfigurationError, match="outside 1-65535"):
            Index.from_urls(f"http://host:{port}/")
        with pytest.raises(ConfigurationError, match="outside 1-65535"):
            check_docker_host(f"tcp://host:{port}", "--docker-host")
        with pytest.raises(ConfigurationError, match="outside 1-65535"):
            check_registry(f"host:{port}")
    for check in (lambda: Index.from_urls("http://u:p@host/"),
                  lambda: check_docker_host("tcp://u:p@host:2375", ""),
                  lambda: check_docker_host("ssh://u:p@host", "")):
        with pytest.raises(ConfigurationError, match="carries credentials"):
            check()
    # ssh's login name is not a secret: the one user part an address may carry
    assert check_docker_host("ssh://deploy@host:22", "") == "ssh://deploy@host:22"
    assert check_docker_host("unix:///var/run/docker.sock", "") == "unix:///var/run/docker.sock"
    with pytest.raises(ConfigurationError, match="absolute path"):
        check_docker_host("unix://run/docker.sock", "")


@pytest.mark.parametrize("text", ["https://127.0.0.1:9/simple?token=tok3n",
                                  "https://h/simple#tok3n", "https://h/simple?",
                                  "file:///srv/index?tok3n"])
def test_a_query_or_fragment_is_refused_and_never_shown(text: str) -> None:
    # An index's project path would land after it (…?token=x/sglang/), and a token in it
    # was printed in full by every error that named the index.
    with pytest.raises(ConfigurationError, match="carries a query or fragment") as refused:
        parse_url(text, ("http", "https", "file"), noun="a URL", hint="h", credentials=True)
    assert "tok3n" not in str(refused.value)
