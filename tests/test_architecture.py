"""The package's shape: stages as layers, no import cycles, a lazy public surface.

The layers contract lives in pyproject.toml ([tool.importlinter]) and is checked with
import-linter; cycles are found on grimp's import graph (the library import-linter uses).
Each check is also run on a copy of the package with one planted violation, so a check
that cannot fail would show up here.
"""

from __future__ import annotations

import ast
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import builder
from tests.helpers.paths import REPO

ROOT = REPO
STAGES = ["source", "patching", "wheel", "behaviour", "kernels", "image", "smoke", "release"]


def _lint_imports(project: Path) -> subprocess.CompletedProcess[str]:
    code = ("import sys\nfrom importlinter.cli import lint_imports\n"
            f"sys.exit(lint_imports(config_filename={str(project / 'pyproject.toml')!r}, "
            "no_cache=True))")
    return subprocess.run([sys.executable, "-c", code],
                          cwd=project, capture_output=True, text=True, timeout=300,
                          env={"PYTHONPATH": str(project), "PATH": "/usr/bin:/bin"})


def _import_graph(project: Path) -> dict[str, list[str]]:
    """Module -> the modules it imports at run time (grimp, in a process that sees only
    ``project``'s copy of the package)."""
    code = ("import json, grimp\n"
            "g = grimp.build_graph('builder', exclude_type_checking_imports=True, "
            "cache_dir=None)\n"
            "print(json.dumps({m: sorted(g.find_modules_directly_imported_by(m)) "
            "for m in g.modules}))")
    done = subprocess.run([sys.executable, "-c", code], cwd=project, capture_output=True,
                          text=True, timeout=300, check=True,
                          env={"PYTHONPATH": str(project), "PATH": "/usr/bin:/bin"})
    graph: dict[str, list[str]] = json.loads(done.stdout)
    return graph


def _cycles(project: Path) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), run-time imports only."""
    graph = _import_graph(project)
    modules = sorted(graph)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for other in graph[module]:
            if other not in index:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in on_stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == module:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for module in modules:
        if module not in index:
            visit(module)
    return found


@pytest.fixture(scope="module")
def planted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the project whose core imports a later stage (both a layer breach and,
    with the release stage importing the core's errors, a cycle)."""
    project = tmp_path_factory.mktemp("planted")
    shutil.copytree(ROOT / "builder", project / "builder",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", project / "pyproject.toml")
    errors = project / "builder" / "core" / "errors.py"
    errors.write_text(errors.read_text() + "\nfrom builder.release import publish  # planted\n")
    return project


def test_stages_import_only_the_core_and_earlier_stages() -> None:
    done = _lint_imports(ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout


def test_a_later_stage_imported_by_the_core_breaks_the_contract(planted: Path) -> None:
    done = _lint_imports(planted)
    assert done.returncode != 0
    assert "builder.core.errors -> builder.release.publish" in done.stdout


def test_no_import_cycles() -> None:
    assert _cycles(ROOT) == []


def test_a_planted_cycle_is_found(planted: Path) -> None:
    cycles = _cycles(planted)
    assert any("builder.core.errors" in c and "builder.release.publish" in c for c in cycles)


def test_the_layers_name_every_stage() -> None:
    folders = sorted(p.name for p in (ROOT / "builder").iterdir()
                     if (p / "__init__.py").is_file())
    assert folders == sorted([*STAGES, "core", "ci", "cli"])
    layers = (ROOT / "pyproject.toml").read_text()
    for folder in folders:
        assert f'"builder.{folder}"' in layers


def test_every_stage_exposes_its_entry_function_and_result() -> None:
    import importlib

    for stage, names in {"source": ("run_fetch", "SourceResult"),
                         "patching": ("run_patch", "PatchResult"),
                         "wheel": ("run_wheels", "WheelResult"),
                         "kernels": ("run_kernels", "KernelResult"),
                         "image": ("run_image", "ImageResult"),
                         "smoke": ("run_smoke", "SmokeReport"),
                         "release": ("run_release", "ReleaseSummary")}.items():
        module = importlib.import_module(f"builder.{stage}")
        for name in names:
            assert name in module.__all__, (stage, name)
            assert getattr(module, name).__module__.startswith(f"builder.{stage}.")


PUBLIC_LIMIT = 25  # issue 23: pypa/build exports 11, nox 6


def _declared_public_names() -> list[ast.ImportFrom]:
    """The ``if TYPE_CHECKING:`` imports of builder/__init__.py, read as a type checker does."""
    tree = ast.parse((ROOT / "builder" / "__init__.py").read_text())
    blocks = [node for node in tree.body if isinstance(node, ast.If)
              and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"]
    assert len(blocks) == 1
    return [node for node in blocks[0].body if isinstance(node, ast.ImportFrom)]


def test_public_surface_is_small_declared_once_and_resolves() -> None:
    import importlib

    declared = {alias.name: node.module for node in _declared_public_names()
                for alias in node.names}
    assert len(builder.__all__) <= PUBLIC_LIMIT, builder.__all__
    assert builder.__all__ == sorted(declared)
    assert dir(builder) == builder.__all__
    for node in _declared_public_names():
        for alias in node.names:
            # ``import X as X``: the explicit re-export strict mypy needs from a user's
            # ``from builder import X``
            assert alias.asname == alias.name, alias.name
            assert node.module is not None
            value = getattr(builder, alias.name)
            assert value is getattr(importlib.import_module(node.module), alias.name)
    # each stage's entry and result, target loading and the errors users catch
    assert {"run_fetch", "run_patch", "run_wheels", "run_kernels", "run_image", "run_smoke",
            "run_release", "SourceResult", "PatchResult", "WheelResult", "KernelResult",
            "ImageResult", "SmokeReport", "ReleaseSummary", "load_targets", "Target",
            "Options", "BuilderError", "ConfigurationError", "MissingToolError",
            "SourceError", "PatchError", "BuildError", "PublishError",
            "VerificationError"} <= set(builder.__all__)
    namespace: dict[str, object] = {}
    exec("from builder import *", namespace)
    assert sorted(set(namespace) - {"__builtins__"}) == builder.__all__
    for name in ("no_such_name", "split_lines", "run_wheel", "__wrapped__"):
        with pytest.raises(AttributeError):
            getattr(builder, name)


def _loaded_after(code: str) -> set[str]:
    done = subprocess.run([sys.executable, "-c", code + "\nimport sys\n"
                           "print('\\n'.join(sorted(sys.modules)))"],
                          cwd=ROOT, capture_output=True, text=True, check=True, timeout=120)
    return set(done.stdout.split())


def test_import_builder_loads_no_stage() -> None:
    loaded = _loaded_after("import builder")
    assert not {m for m in loaded if m.startswith("builder.")}
    assert not loaded & {"docker", "git", "pypi_simple", "build", "rich", "unidiff"}


def test_a_public_name_loads_only_its_own_stage() -> None:
    loaded = _loaded_after("from builder import load_targets, BuilderError")
    stages = {m.split(".")[1] for m in loaded if m.startswith("builder.")}
    assert stages == {"core"}, stages


def test_targets_command_loads_only_the_core() -> None:
    loaded = _loaded_after("from builder.cli import main\n"
                           "import contextlib, io\n"
                           "with contextlib.redirect_stdout(io.StringIO()):\n"
                           "    main(['targets', '--json'])")
    stages = {m.split(".")[1] for m in loaded if m.startswith("builder.") and m.count(".") >= 1}
    assert stages <= {"cli", "core"}, stages
    assert not loaded & {"docker", "git", "pypi_simple", "build", "unidiff", "wheel"}


_WRITES = {"write_text", "write_bytes", "atomic_write_bytes"}


def _is_json_dump(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
        node.func.attr in {"dump", "dumps"} and isinstance(node.func.value, ast.Name) and \
        node.func.value.id == "json"


def _json_writes(root: ast.AST) -> list[ast.Call]:
    """Calls under ``root`` that write JSON to a file: ``json.dump(...)``, or a write
    whose argument is built with ``json.dumps``."""
    found = []
    for node in ast.walk(root):
        if not isinstance(node, ast.Call):
            continue
        name = node.func.attr if isinstance(node.func, ast.Attribute) else \
            node.func.id if isinstance(node.func, ast.Name) else ""
        if (_is_json_dump(node) and name == "dump") or (
                name in _WRITES and any(_is_json_dump(n) for a in node.args
                                        for n in ast.walk(a))):
            found.append(node)
    return found


def cache_manifest_writes(source: str, where: str) -> list[str]:
    """Where ``source`` (a module other than ``builder/core/cache.py``) makes a cache
    entry or writes its manifest itself instead of through ``Cache.artifact``: a call of
    the temporary-folder primitive (``.building``/``._building``), the manifest's name
    (``builder.core.cache.MANIFEST`` or its value), a JSON write inside a build function
    given to ``.artifact``, or a JSON write into a path made from ``.entry(...)``."""
    from builder.core.cache import MANIFEST

    tree = ast.parse(source)
    functions = {n.name: n for n in ast.walk(tree)
                 if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
    found = []
    for node in ast.walk(tree):
        line = f"{where}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Constant) and node.value == MANIFEST:
            found.append(f"{line}: names the cache manifest {MANIFEST!r}")
        elif isinstance(node, ast.ImportFrom) and node.module == "builder.core.cache" and \
                any(a.name == "MANIFEST" for a in node.names):
            found.append(f"{line}: imports the cache manifest's name")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr in {"building", "_building"}:
                found.append(f"{line}: makes a cache entry by hand (.{node.func.attr})")
            elif node.func.attr == "artifact":
                builds = [*node.args[2:3], *(k.value for k in node.keywords if k.arg == "build")]
                for given in builds:
                    bodies = [given] if isinstance(given, ast.Lambda) else \
                        [functions[n.id] for n in ast.walk(given)
                         if isinstance(n, ast.Name) and n.id in functions]
                    for body in bodies:
                        found += [f"{where}:{w.lineno}: a build function writes JSON "
                                  "(its metadata is what it returns)" for w in _json_writes(body)]
            elif node.func.attr in _WRITES and any(
                    isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and
                    n.func.attr == "entry" for n in ast.walk(node.func.value)) and \
                    node in _json_writes(node):
                found.append(f"{line}: writes JSON into a cache entry")
    return found


_OLD_RECIPE = '''
def fetch(cache, key):
    entry = cache.lookup("source", key)
    if entry is None:
        with cache.building("source", key) as tmp:
            (tmp / "source.json").write_text(json.dumps({"rule": 2}))

def stage(cache, key):
    def build(tmp):
        with open(tmp / "meta.json", "w") as handle:
            json.dump({"a": 1}, handle)
        return {}
    (cache.entry("wheel", key) / "wheel.json").write_text(json.dumps({}))
    return cache.artifact("wheel", key, build)
'''


def test_no_module_but_the_cache_writes_a_cache_manifest() -> None:
    found = [hit for path in sorted((ROOT / "builder").rglob("*.py"))
             if path != ROOT / "builder" / "core" / "cache.py"
             for hit in cache_manifest_writes(path.read_text(), str(path.relative_to(ROOT)))]
    assert found == [], "\n".join(found)
    # the check sees the recipe it replaced, in each of its forms
    planted = cache_manifest_writes(_OLD_RECIPE, "planted.py")
    assert sorted(planted) == [
        "planted.py:11: a build function writes JSON (its metadata is what it returns)",
        "planted.py:13: writes JSON into a cache entry",
        "planted.py:5: makes a cache entry by hand (.building)"], planted


# What the smoke probe's script side may import: the standard library, its neighbours in
# builder/smoke/script/ (links to builder/core/arch.py and builder/smoke/shared.py), and the
# stack it tests, only inside the checks that need it: torch, FlashInfer (and its kernel
# wheel, flashinfer_jit_cache), sglang (its metadata), safetensors (the tiny model), tokenizers
# and transformers (the tiny model's optional tokenizer: SGLang's own dependencies) and pynvml
# (nvidia-ml-py, the driver's version).
PROBE_SCRIPT = ROOT / "builder" / "smoke" / "script"
GPU_STACK = frozenset({"torch", "flashinfer", "flashinfer_jit_cache", "sglang", "safetensors",
                       "tokenizers", "transformers", "pynvml"})


def _script_imports(folder: Path) -> list[str]:
    """``file:line: module`` for every import in the script folder's files that is neither
    the standard library, a neighbour nor the GPU stack; imports at module level, inside
    functions, under ``TYPE_CHECKING`` and through ``importlib.import_module("name")``."""
    files = sorted(folder.glob("*.py"))
    neighbours = {path.stem for path in files}
    allowed = set(sys.stdlib_module_names) | neighbours | GPU_STACK | {"__future__"}
    found = []
    for path in files:
        tree = ast.parse(path.read_text(), filename=str(path))  # read through the links
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = ["." if node.level else node.module or ""]
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute | ast.Name) \
                    and (getattr(node.func, "attr", None) or getattr(node.func, "id", None)) \
                    == "import_module" and node.args and \
                    isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
                names = [node.args[0].value]
            for name in names:
                if name.split(".")[0] not in allowed:
                    found.append(f"{path.name}:{node.lineno}: {name}")
    return found


def test_the_probe_script_imports_only_the_standard_library_and_the_gpu_stack(
        tmp_path: Path) -> None:
    assert {"smoke_probe.py", "sm120_arch.py", "smoke_shared.py", "tiny_model.py"} <= \
        {p.name for p in PROBE_SCRIPT.glob("*.py")}
    assert _script_imports(PROBE_SCRIPT) == []
    # The builder reads the script's output, never imports it as code.
    script_modules = {p.stem for p in PROBE_SCRIPT.glob("*.py")}
    for path in (ROOT / "builder").rglob("*.py"):
        if path.parent == PROBE_SCRIPT:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import | ast.ImportFrom):
                modules = [a.name for a in node.names] if isinstance(node, ast.Import) \
                    else [node.module or ""]
                assert not any(m.split(".")[0] in script_modules or
                               m.startswith("builder.smoke.script") for m in modules), path
    # Planted: the builder at module level, and requests inside a check.
    planted = tmp_path / "script"
    shutil.copytree(PROBE_SCRIPT, planted)
    probe = planted / "smoke_probe.py"
    text = probe.read_text()
    text = text.replace("import argparse\n", "import argparse\nimport builder.core.cache\n", 1)
    text = text.replace('    """Check 1: the GPU', '    import requests\n    """Check 1: the GPU',
                        1)
    probe.write_text(text)
    found = _script_imports(planted)
    assert len(found) == 2 and found[0].endswith(": builder.core.cache") and \
        found[1].endswith(": requests"), found


BEHAVIOUR_SCRIPT = ROOT / "builder" / "behaviour" / "script"


def _not_allowed(found: list[str]) -> list[str]:
    """``found`` less the kernel-fit script's tilelang and TVM: they are installed beside
    the release's environment for it alone (builder/behaviour/fit.py)."""
    return [f for f in found if not (f.startswith("kernel_fit.py:") and
                                     f.split(": ")[1].split(".")[0] in {"tilelang", "tvm"})]


def test_the_behaviour_script_imports_only_the_standard_library_torch_and_sglang(
        tmp_path: Path) -> None:
    """What runs in a release's behaviour environment imports nothing of the builder."""
    assert {"behaviour_checks.py", "sm120_device.py", "standins.py", "tiny_models.py"} <= \
        {p.name for p in BEHAVIOUR_SCRIPT.glob("*.py")}
    # The kernel-fit script lowers TileLang kernels: tilelang (and its TVM) is installed
    # beside the release's environment for it (builder/behaviour/fit.py), for it alone.
    assert _not_allowed(_script_imports(BEHAVIOUR_SCRIPT)) == []
    planted = tmp_path / "script"
    shutil.copytree(BEHAVIOUR_SCRIPT, planted)
    checks = planted / "behaviour_checks.py"
    checks.write_text(checks.read_text().replace(
        "import sm120_device\n", "import sm120_device\nfrom builder.core import arch\n", 1))
    assert [f.split(": ")[-1] for f in _not_allowed(_script_imports(planted))] == ["builder.core"]
