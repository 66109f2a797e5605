"""The test tiers, a pytest plugin (loaded by ``tests/conftest.py``).

Every test is in exactly one tier: ``fast`` (the default a newcomer runs: no Docker Engine,
no registry or Redis, no nvcc, no big downloads beyond the pinned sdists and wheels) or
``slow`` (the rest; CI runs both). A slow test says so on itself,
``@pytest.mark.slow(reason="...")`` (or a module's ``pytestmark``); every other test gets
the ``fast`` mark here. One rule is enforced at collection: a test that uses a fixture of
:data:`SLOW_FIXTURES` (directly or through another fixture) without the ``slow`` mark, or a
``slow`` mark without a reason, stops the collection naming the fixture and why it is slow.

Under ``--dist loadgroup`` (nox -s tests) each test also gets an ``xdist_group``: the tests
on the session's services share one worker (one dockerd, registry, index, Redis), the
behaviour tests another, every other file is its own group. docs/testing.md says how to run
each tier.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

SERVICES = "services"
# The kernel build tests share the builder cache's kernel entries with the sccache test
# (on Redis, a service), which empties them: one worker runs them all, never two at once.
# A test that builds a FlashInfer environment in its body says so: slow(group=KERNEL_ENV).
KERNEL_ENV = SERVICES
# The behaviour matrix and the kernel fit share the behaviour environments and the fit's
# cache entries (cold: minutes each): one worker, not the services one (its critical path).
BEHAVIOUR = "behaviour"


@dataclass(frozen=True)
class Slow:
    """Why a test is slow, and the xdist group it runs in (None: its file's)."""

    reason: str
    group: str | None


#: Fixture -> why a test that uses it (directly or through another fixture) is slow.
#: The first that matches, in this order, decides the group.
SLOW_FIXTURES = {
    "docker_engine": Slow("starts a Docker Engine", SERVICES),
    "registry": Slow("starts a docker-registry", SERVICES),
    "package_index": Slow("starts a pypiserver", SERVICES),
    "redis_server": Slow("starts redis-server", SERVICES),
    "kernel_cache": Slow("builds FlashInfer kernels in a build environment of several GB",
                         KERNEL_ENV),
    "tilelang_nvcc": Slow("lowers TileLang kernels and compiles them with nvcc", BEHAVIOUR),
    "nvcc": Slow("compiles CUDA code with nvcc", SERVICES),
    "token_registry": Slow("starts a docker-registry and a token server", None),
    "installed": Slow("a venv with the 0.5.9 wheel and FlashInfer installed", None),
}


def slow_fixture(item: pytest.Item) -> tuple[str, Slow] | None:
    """The first fixture of :data:`SLOW_FIXTURES` that ``item`` uses, with its reason.

    Args:
        item: a collected test.

    Returns:
        ``(fixture name, Slow)``, or None when it uses none of them.
    """
    used = set(getattr(item, "fixturenames", ()))
    return next(((name, slow) for name, slow in SLOW_FIXTURES.items() if name in used), None)


def tier_errors(item: pytest.Item) -> list[str]:
    """What is wrong with ``item``'s tier marks (empty when nothing is).

    Args:
        item: a collected test.

    Returns:
        One line per fault: a slow fixture used without the ``slow`` mark, a ``slow`` mark
        without a reason, a ``fast`` mark by hand on a slow test.
    """
    mark = item.get_closest_marker("slow")
    fixture = slow_fixture(item)
    errors = []
    if fixture is not None and mark is None:
        name, slow = fixture
        errors.append(f"{item.nodeid} uses {name} ({slow.reason}): mark it "
                      f'@pytest.mark.slow(reason="...")')
    if mark is not None and not str(mark.kwargs.get("reason", "")).strip():
        errors.append(f'{item.nodeid} is marked slow without a reason: '
                      f'@pytest.mark.slow(reason="...")')
    if (mark is not None or fixture is not None) and item.get_closest_marker("fast"):
        errors.append(f"{item.nodeid} is marked fast but is slow")
    return errors


def xdist_group(item: pytest.Item) -> str:
    """The xdist group ``item`` runs in: its slow fixture's, its ``slow`` mark's ``group``,
    else its file's."""
    fixture = slow_fixture(item)
    if fixture is not None and fixture[1].group:
        return fixture[1].group
    mark = item.get_closest_marker("slow")
    if mark is not None and mark.kwargs.get("group"):
        return str(mark.kwargs["group"])
    return item.nodeid.partition("::")[0]


class GroupsTakeEffect:
    """Stops the run when ``--dist loadgroup`` would ignore the groups set below.

    pytest-xdist 3.8 tells the controller a test's group by appending ``@GROUP`` to the
    node id, which pytest 9.2 no longer lets a plugin change (pytest-xdist issue #1386):
    the tests would then be spread one by one, and two kernel builds empty each other's
    cache entries. Every test gets a group under loadgroup, so every id must carry one.
    """

    def pytest_xdist_node_collection_finished(self, node: object, ids: list[str]) -> None:
        """Exit (status 4, a usage error) when a worker's test ids lack their group."""
        lost = [nodeid for nodeid in ids if nodeid.rfind("@") <= nodeid.rfind("]")]
        if lost:
            pytest.exit(f"--dist loadgroup ignores the xdist groups on pytest "
                        f"{pytest.__version__} (pytest-xdist issue #1386; {len(lost)} of "
                        f"{len(ids)} tests, e.g. {lost[0]}): install the test extra's pytest "
                        "(pip install -e '.[test]')", returncode=pytest.ExitCode.USAGE_ERROR)


def pytest_configure(config: pytest.Config) -> None:
    """On the controller of ``--dist loadgroup``: check the groups take effect."""
    if not hasattr(config, "workerinput") and config.getoption("dist", "no") == "loadgroup":
        config.pluginmanager.register(GroupsTakeEffect(), "groups-take-effect")


# tryfirst: xdist's own hook reads the xdist_group marks when it runs (it appends the group
# to the node id); after it, a mark added here would be ignored.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config,
                                  items: list[pytest.Item]) -> None:
    """Put every test without a ``slow`` mark in the ``fast`` tier, and every test in its
    xdist group under ``--dist loadgroup``.

    Raises:
        pytest.UsageError: a test that uses a slow fixture without the ``slow`` mark, a
            ``slow`` mark without a reason, or a ``fast`` mark by hand on a slow test.
    """
    # On an xdist worker `dist` reads "no" and `loadgroup` says what the controller was given.
    grouped = bool(getattr(config.option, "loadgroup", False)) or \
        getattr(config.option, "dist", "no") == "loadgroup"
    wrong = []
    for item in items:
        errors = tier_errors(item)
        wrong += errors
        if not errors and item.get_closest_marker("slow") is None:
            item.add_marker(pytest.mark.fast)
        if grouped:
            item.add_marker(pytest.mark.xdist_group(xdist_group(item)))
    if wrong:
        raise pytest.UsageError("tiers (tests/helpers/tiers.py):\n  " + "\n  ".join(wrong))
