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
    assert folders == sorted([*STAGES, "core", "targets", "cli"])
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


# ----------------------------------------------------------- one owner per rule (issue 35)

BUILDER = ROOT / "builder"


def _sources() -> list[tuple[Path, str]]:
    """Every module of the package (links, the probe's copies of core modules, skipped)."""
    return [(path, path.read_text()) for path in sorted(BUILDER.rglob("*.py"))
            if not path.is_symlink()]


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def address_parsing(source: str, label: str) -> list[str]:
    """``label:line: ...`` for each URL parse (``urllib.parse.urlsplit``/``urlparse``,
    imported or called) -- only builder/core/address.py may split an address."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module == "urllib.parse":
            names = {a.name for a in node.names} & {"urlsplit", "urlparse"}
            found += [f"{label}:{node.lineno}: imports {n}" for n in sorted(names)]
        elif isinstance(node, ast.Attribute) and node.attr in ("urlsplit", "urlparse"):
            found.append(f"{label}:{node.lineno}: calls {node.attr}")
    return found


def test_one_module_parses_addresses() -> None:
    found = [hit for path, text in _sources() if _rel(path) != "builder/core/address.py"
             for hit in address_parsing(text, _rel(path))]
    assert found == [], "\n".join(found)
    planted = address_parsing("import urllib.parse\nfrom urllib.parse import urlsplit\n"
                              "port = urllib.parse.urlparse(u).port\n", "planted.py")
    assert planted == ["planted.py:2: imports urlsplit", "planted.py:3: calls urlparse"]


# The writers of a series file: the functions of builder/patching/series.py that render it
# with tomlkit. Any other write whose target names a series, or a write there that does not
# go through tomlkit, is a second owner.
SERIES_WRITERS = {"append_entry": "tomlkit.dumps", "repin_entries": "tomlkit.string"}
_WRITES = {"rewrite_user_file", "write_text", "write_bytes", "temporary_beside"}


def series_writes(source: str, label: str, *, owner: bool = False) -> list[str]:
    """``label:line: ...`` for each write of a series file outside its tomlkit writers:
    a file write whose target expression names ``series``, text built by hand (an f-string
    with a ``[[patch]]`` header, ``bytes.replace``) in the owner."""
    found = []
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        target = ast.unparse(func.value) if isinstance(func, ast.Attribute) and \
            name in ("write_text", "write_bytes") else \
            ast.unparse(node.args[0]) if node.args else ""
        if name in _WRITES and "series" in target.lower():
            found.append(f"{label}:{node.lineno}: writes {target} by {name}")
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and \
                "[[patch]]\n" in node.value:
            found.append(f"{label}:{node.lineno}: builds a [[patch]] table as text")
    if owner:
        functions = {n.name: ast.unparse(n) for n in ast.walk(tree)
                     if isinstance(n, ast.FunctionDef)}
        for function, renderer in SERIES_WRITERS.items():
            if renderer not in functions.get(function, ""):
                found.append(f"{label}: {function} does not render with {renderer}")
    return found


def test_series_toml_is_written_only_through_tomlkit() -> None:
    """add-patch and refresh write the series through series.append_entry and
    series.repin_entries (tomlkit-rendered), never as an f-string or a bytes.replace."""
    found = [hit for path, text in _sources()
             for hit in series_writes(text, _rel(path),
                                      owner=_rel(path) == "builder/patching/series.py")
             if not (_rel(path) == "builder/patching/series.py" and " writes " in hit)]
    assert found == [], "\n".join(found)
    planted = series_writes('entry = ("\\n[[patch]]\\n" f"file = {name}\\n")\n'
                            "rewrite_user_file(series_file, original + entry)\n"
                            "series.path.write_bytes(data.replace(old, new))\n", "planted.py",
                            owner=True)
    assert planted == [
        "planted.py:2: writes series_file by rewrite_user_file",
        "planted.py:3: writes series.path by write_bytes",
        "planted.py:1: builds a [[patch]] table as text",
        "planted.py: append_entry does not render with tomlkit.dumps",
        "planted.py: repin_entries does not render with tomlkit.string"], planted


# An SM12x arch as data: "12.0", "12.1", with a suffix, or an sm_120-style token. Prose
# (messages, help) may name one; a value the code uses comes from builder/core/arch.py.
_ARCH_VALUE = r"12\.[01][af]?|sm_12[01][af]?"
ARCH_LITERALS_ALLOWED = {
    # run by path in the release's own interpreter, where the builder is not importable
    # (test_the_behaviour_script_imports_only_the_standard_library_torch_and_sglang)
    "builder/behaviour/script/kernel_fit.py": "runs without the builder: TileLang's and "
                                              "nvcc's SM120 target spelled there",
    "builder/behaviour/script/sm120_device.py": "runs without the builder: its default "
                                                "capability when SM120_CAPABILITY is unset",
}


def arch_literals(source: str, label: str) -> list[str]:
    """``label:line: 'value'`` for each string constant (docstrings excepted) that is an
    SM12x arch value, or a token without spaces holding one (``-arch=sm_120a``)."""
    import re

    tree = ast.parse(source)
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, ast.Module | ast.FunctionDef | ast.AsyncFunctionDef
                                | ast.ClassDef) and node.body
                  and isinstance(node.body[0], ast.Expr)
                  and isinstance(node.body[0].value, ast.Constant)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and \
                id(node) not in docstrings:
            text = node.value.strip()
            if re.fullmatch(_ARCH_VALUE, text) or (
                    " " not in text and re.search(rf"(?<![\w.])(?:{_ARCH_VALUE})(?!\w)", text)):
                found.append(f"{label}:{node.lineno}: {node.value!r}")
    return found


def test_no_arch_literal_outside_core_arch() -> None:
    found = [hit for path, text in _sources()
             if _rel(path) != "builder/core/arch.py" and _rel(path) not in ARCH_LITERALS_ALLOWED
             for hit in arch_literals(text, _rel(path))]
    assert found == [], "\n".join(found)
    for allowed in ARCH_LITERALS_ALLOWED:  # each entry still needed
        assert arch_literals((ROOT / allowed).read_text(), allowed), allowed
    planted = arch_literals('"""Docstrings may say 12.0f."""\nA = "12.0f"\n'
                            'B = ["-arch=sm_120a"]\nC = "use 12.0a up to 0.6.6"\n'
                            'D = "sm120/profile.toml"\n', "planted.py")
    assert planted == ["planted.py:2: '12.0f'", "planted.py:3: '-arch=sm_120a'"], planted


# No exceptions (issue 35): the last oversized functions (target_gaps, run_release) are
# split into named steps, so a new one fails the test below rather than joining a list.
MAX_LINES = 100


def oversized(source: str, label: str) -> list[str]:
    """``label:name: why`` for each function over :data:`MAX_LINES` lines or graded E or F
    by radon's cyclomatic complexity (``cc_rank``: E from 31, F from 41; radon 6)."""
    from radon.complexity import cc_rank, cc_visit

    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and \
                node.end_lineno is not None and node.end_lineno - node.lineno + 1 > MAX_LINES:
            found.append(f"{label}:{node.name}: {node.end_lineno - node.lineno + 1} lines")
    blocks = list(cc_visit(source))
    while blocks:
        block = blocks.pop()
        blocks += [*getattr(block, "methods", []), *getattr(block, "closures", [])]
        if cc_rank(block.complexity) in "EF":
            found.append(f"{label}:{block.name}: radon {cc_rank(block.complexity)} "
                         f"({block.complexity})")
    return sorted(found)


def test_no_function_over_100_lines_or_graded_e_or_f() -> None:
    found = [hit for path, text in _sources() for hit in oversized(text, _rel(path))]
    assert found == [], "\n".join(found)
    branches = "".join(f"    if x == {i}:\n        y += {i}\n" for i in range(55))
    planted = oversized(f"def f(x):\n    y = 0\n{branches}    return y\n"
                        "def g(x):\n    return x\n", "planted.py")
    assert planted == ["planted.py:f: 113 lines", "planted.py:f: radon F (56)"], planted


def json_file_reads(source: str, label: str) -> list[str]:
    """``label:line: ...`` for each JSON parse of a file's content outside
    ``builder.core.userfiles.parse_json`` (issue 38, class H: one parser, refusing an
    object that names one key twice): ``json.load(handle)``, or ``json.loads`` of a
    ``read_text()``, ``read_bytes()`` or ``read(...)`` (a file, a zip member)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "json"):
            continue
        if node.func.attr == "load":
            found.append(f"{label}:{node.lineno}: json.load")
        elif node.func.attr == "loads" and node.args and isinstance(node.args[0], ast.Call) \
                and isinstance(node.args[0].func, ast.Attribute) \
                and node.args[0].func.attr in ("read_text", "read_bytes", "read"):
            found.append(f"{label}:{node.lineno}: json.loads of {node.args[0].func.attr}()")
    return found


def test_every_json_file_is_read_by_the_one_parser() -> None:
    """The builder's modules read JSON files through userfiles.parse_json (or
    read_json_input); the scripts that run in an image or a probe's interpreter
    (``script/``, ``data/``: the standard library only) are not the builder's."""
    found = [hit for path, text in _sources()
             if not {"script", "data"} & set(path.relative_to(BUILDER).parts[:-1])
             for hit in json_file_reads(text, _rel(path))]
    assert found == [], "\n".join(found)
    planted = sorted(json_file_reads("import json\nwith open(p) as h:\n    json.load(h)\n"
                                     "json.loads(path.read_text())\njson.loads(zf.read(n))\n"
                                     "json.loads(done.stdout)\n", "planted.py"))
    assert planted == ["planted.py:3: json.load", "planted.py:4: json.loads of read_text()",
                       "planted.py:5: json.loads of read()"], planted


def imports_of_test_files(source: str, label: str) -> list[str]:
    """``label:line: module`` for each import of ``conftest`` or of another test file
    (``test_*``): shared test code lives in ``tests/helpers/`` (docs/testing.md)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else \
            [node.module or ""] if isinstance(node, ast.ImportFrom) else []
        for name in names:
            last = name.rsplit(".", 1)[-1]
            if last == "conftest" or last.startswith("test_"):
                found.append(f"{label}:{node.lineno}: {name}")
    return found


def test_no_test_file_imports_conftest_or_another_test_file() -> None:
    found = [hit for path in sorted((ROOT / "tests").rglob("*.py"))
             for hit in imports_of_test_files(path.read_text(), _rel(path))]
    assert found == [], "\n".join(found)
    planted = ("from tests.conftest import UpstreamRelease\nimport conftest\n"
               "from tests.cli.test_layout import walk\nfrom tests.helpers.releases import X\n")
    assert imports_of_test_files(planted, "p.py") == [
        "p.py:1: tests.conftest", "p.py:2: conftest", "p.py:3: tests.cli.test_layout"]
