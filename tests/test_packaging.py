"""What an install ships and reports: the package list in pyproject.toml, kernels/ from a plain source checkout,
and the commit `gem bench` records."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import ROOT

from gemkernels.benchmark.machine import package_commit

tomllib = pytest.importorskip("tomllib")


def test_pyproject_lists_every_package_folder():
    """A folder with an ``__init__.py`` left out of ``[tool.setuptools] packages`` would be missing from wheels."""
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    folders = {".".join(init.parent.relative_to(ROOT).parts) for init in (ROOT / "gemkernels").rglob("__init__.py")}
    assert listed == folders | {"gemkernels.kernels"}


def test_a_source_checkout_without_install_loads_kernels_as_gemkernels_kernels(tmp_path):
    """Only the tree on PYTHONPATH (no site-packages, so no install of gemkernels is visible): the numba and triton
    backends find ``gemkernels.kernels`` in the checkout's ``kernels/``."""
    for folder in ("gemkernels", "kernels"):
        shutil.copytree(ROOT / folder, tmp_path / folder, ignore=shutil.ignore_patterns("__pycache__"))
    numpy_home = Path(np.__file__).resolve().parents[1]  # site-packages, without its .pth files (python -S)
    code = ("import gemkernels.kernels.greedy_cpu, gemkernels; k = gemkernels.kernels; "
            "assert k.greedy_cpu is gemkernels.kernels.greedy_cpu; print(k.__file__)")
    done = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{numpy_home}"})
    if "No module named 'numba'" in done.stderr:
        pytest.skip("needs numba")
    assert done.returncode == 0, done.stderr
    assert Path(done.stdout.splitlines()[0]).resolve() == (tmp_path / "kernels" / "__init__.py").resolve()


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_the_commit_is_the_imported_packages_not_the_enclosing_repositorys(tmp_path, monkeypatch):
    """A checkout reports its HEAD and whether tracked files changed; a package inside some other repository (a
    virtual environment in a project) reports no commit rather than that repository's."""
    def run(*args, cwd=tmp_path):
        return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()

    run("init", "-q")
    (tmp_path / "a.txt").write_text("one")
    run("add", "a.txt")
    run("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    head = run("rev-parse", "HEAD")
    assert package_commit(tmp_path) == (head, False)
    (tmp_path / "a.txt").write_text("two")
    assert package_commit(tmp_path) == (head, True)
    site = tmp_path / ".venv" / "lib" / "site-packages"
    site.mkdir(parents=True)
    monkeypatch.delenv("GEMKERNELS_GIT_COMMIT", raising=False)
    assert package_commit(site)[1] is None and package_commit(site)[0] != head
    monkeypatch.setenv("GEMKERNELS_GIT_COMMIT", "abc123")
    assert package_commit(site) == ("abc123", None)


def test_an_installed_kernels_package_is_not_hidden_by_the_checkouts_folder(tmp_path):
    """Run from the checkout's root (the README's test command), ``kernels/`` was the top-level package ``kernels``
    and hid Hugging Face's, which transformers 5.25 imports: loading a MiniLM through sentence-transformers failed
    with ImportError (CUDAProperties) in CI. Once gemkernels is imported, an installed ``kernels`` wins."""
    site = tmp_path / "site"
    (site / "kernels").mkdir(parents=True)
    (site / "kernels" / "__init__.py").write_text("CUDAProperties = 'installed'\n")
    code = ("import gemkernels, kernels, importlib.util; "
            "print(kernels.CUDAProperties, importlib.util.find_spec('kernels').origin)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(site)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[0] == "installed" and str(site) in done.stdout


def test_an_installed_kernels_package_wins_over_a_source_tree_that_tests_put_on_the_path(tmp_path):
    """The sdist stage of CI: gemkernels installed, its tests run from the unpacked sdist with ``-P`` and put the
    tree's root on sys.path; an installed ``kernels`` beside the installed gemkernels must still win."""
    site = tmp_path / "site"
    (site / "kernels").mkdir(parents=True)
    (site / "kernels" / "__init__.py").write_text("CUDAProperties = 'installed'\n")
    (site / "gemkernels").mkdir()  # as an installed gemkernels sits beside it in site-packages
    (site / "gemkernels" / "__init__.py").write_text("")
    code = (f"import sys; sys.path.insert(0, {str(ROOT)!r}); import gemkernels, kernels; "
            "print(kernels.CUDAProperties)")
    done = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(site)})
    if "unknown option -P" in done.stderr or "Unknown option: -P" in done.stderr:
        pytest.skip("python -P needs Python 3.11")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[0] == "installed"
