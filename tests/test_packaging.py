"""Packaging and layering.

* Every directory with an ``__init__.py`` under ``polyc/``, ``frontend/`` and ``codegen/``
  is a package listed in setup.cfg's ``[options] packages`` whose ``package_dir`` mapping
  resolves to that directory (a subpackage missing from setup.cfg is silently left out
  of wheels, while the editable install and the tests still see it).
* The import direction of the layers (imports read with ``ast``, function-level ones
  included):

  - ``polyc/`` core modules never import the frontends or the code generator; only the
    wiring modules (``pipeline``, ``api``, ``cli``, ``__init__``, ``__main__``) may;
  - ``frontend/`` uses only ``polyc.ir``, ``polyc.expr``, ``polyc.dtypes``, ``polyc.errors``,
    ``polyc.limits``, ``polyc.program`` and the IR-to-IR pass ``polyc.inline`` from polyc
    (plus its own package, the standard library, numpy and islpy);
  - ``codegen/`` uses only ``polyc.ir``, ``polyc.expr``, ``polyc.dtypes``, ``polyc.errors``,
    ``polyc.limits``, ``polyc.options``, ``polyc.host`` (plus its own package, the standard library,
    numpy, islpy, cgen).
"""
from __future__ import annotations

import ast
import configparser
import importlib.util
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: source directory -> the package it is installed as
SOURCE_ROOTS = {"polyc": "polyc", "frontend": "polyc.frontend", "codegen": "polyc.codegen"}


def _setup_cfg() -> tuple[list[str], dict[str, str]]:
    cfg = configparser.ConfigParser()
    assert cfg.read(os.path.join(ROOT, "setup.cfg")), "setup.cfg not found"
    packages = [p.strip() for p in cfg["options"]["packages"].split("\n") if p.strip()]
    package_dir: dict[str, str] = {}
    for line in cfg["options"].get("package_dir", "").split("\n"):
        if line.strip():
            key, _, value = line.partition("=")
            package_dir[key.strip()] = value.strip()
    return packages, package_dir


def _resolve(package: str, package_dir: dict[str, str]) -> str:
    """The directory setuptools takes ``package`` from: the longest mapped dotted prefix
    (``""`` is the root), then the remaining parts as subdirectories."""
    parts = package.split(".")
    for n in range(len(parts), -1, -1):
        key = ".".join(parts[:n])
        if key in package_dir or (n == 0 and "" in package_dir):
            base = package_dir.get(key, package_dir.get("", ""))
            return os.path.normpath(os.path.join(base, *parts[n:]))
    return os.path.normpath(os.path.join(*parts))


def _source_packages() -> dict[str, str]:
    """package name -> directory (relative to ROOT) for every ``__init__.py`` found."""
    found: dict[str, str] = {}
    for src, pkg in SOURCE_ROOTS.items():
        for dirpath, dirnames, filenames in os.walk(os.path.join(ROOT, src)):
            dirnames[:] = [d for d in dirnames if d != "__pycache__" and not d.startswith(".")]
            rel = os.path.relpath(dirpath, ROOT)
            if "__init__.py" in filenames:
                sub = os.path.relpath(rel, src)
                name = pkg if sub == "." else pkg + "." + sub.replace(os.sep, ".")
                found[name] = os.path.normpath(rel)
    return found


SOURCE_PACKAGES = _source_packages()


def test_source_roots_are_packages():
    assert set(SOURCE_ROOTS.values()) <= set(SOURCE_PACKAGES), SOURCE_PACKAGES


@pytest.mark.parametrize("package", sorted(SOURCE_PACKAGES))
def test_package_is_listed_with_its_directory(package):
    packages, package_dir = _setup_cfg()
    assert package in packages, (f"{SOURCE_PACKAGES[package]}/__init__.py is package "
                                 f"{package!r}, missing from setup.cfg [options] packages "
                                 f"(it would be left out of wheels)")
    assert _resolve(package, package_dir) == SOURCE_PACKAGES[package], (
        f"setup.cfg package_dir maps {package!r} to {_resolve(package, package_dir)!r}, "
        f"not {SOURCE_PACKAGES[package]!r}")


def test_listed_packages_exist():
    packages, package_dir = _setup_cfg()
    for package in packages:
        path = os.path.join(ROOT, _resolve(package, package_dir), "__init__.py")
        assert os.path.isfile(path), f"setup.cfg lists {package!r} but {path} does not exist"
    for key, value in package_dir.items():
        assert os.path.isdir(os.path.join(ROOT, value)), f"package_dir {key} = {value}"


def test_no_python_directory_without_init():
    """A directory of modules with no ``__init__.py`` would be a namespace package that
    ``packages =`` does not pick up."""
    for src in SOURCE_ROOTS:
        for dirpath, dirnames, filenames in os.walk(os.path.join(ROOT, src)):
            dirnames[:] = [d for d in dirnames if d != "__pycache__" and not d.startswith(".")]
            if any(f.endswith(".py") for f in filenames):
                assert "__init__.py" in filenames, f"{dirpath} has modules but no __init__.py"


@pytest.mark.parametrize("package", sorted(SOURCE_PACKAGES))
def test_installed_package_comes_from_its_directory(package):
    """The (editable) install imports each package from the directory setup.cfg names."""
    spec = importlib.util.find_spec(package)
    assert spec is not None and spec.origin, package
    want = os.path.join(ROOT, SOURCE_PACKAGES[package], "__init__.py")
    assert os.path.realpath(spec.origin) == os.path.realpath(want)


# ---------------------------------------------------------------------------------------
# import direction

def _modules() -> list[tuple[str, str, str]]:
    """(source root, module name, path) for every module of the three source roots."""
    out = []
    for package, directory in sorted(SOURCE_PACKAGES.items()):
        src = directory.split(os.sep)[0]
        for f in sorted(os.listdir(os.path.join(ROOT, directory))):
            if f.endswith(".py"):
                name = package if f == "__init__.py" else f"{package}.{f[:-3]}"
                out.append((src, name, os.path.join(ROOT, directory, f)))
    return out


MODULES = _modules()
KNOWN_MODULES = {name for _, name, _ in MODULES}


def _imports(module: str, path: str) -> set[str]:
    """The absolute names of every module imported by ``module`` (``from P import X``
    counts as ``P.X`` when that is a module of ours, otherwise as ``P``)."""
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    is_package = path.endswith("__init__.py")
    here = module if is_package else module.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here.split(".")
                base = base[:len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                out.add(sub if sub in KNOWN_MODULES else target)
    return out


def _top(name: str) -> str:
    return name.split(".")[0]


THIRD_PARTY = {"frontend": {"numpy", "islpy", "onnx", "pycparser"}, "codegen": {"numpy", "islpy", "cgen"}}
ALLOWED_CORE = {"frontend": {"polyc.ir", "polyc.expr", "polyc.dtypes", "polyc.errors",
                             "polyc.program", "polyc.inline", "polyc.limits",
                             "polyc.guards", "polyc.rewrite"},
                "codegen": {"polyc.ir", "polyc.expr", "polyc.dtypes", "polyc.errors",
                            "polyc.options", "polyc.program", "polyc.limits",
                            "polyc.marks", "polyc.host"}}
WIRING = {"polyc.pipeline", "polyc.api", "polyc.cli", "polyc", "polyc.__main__", "polyc.model",
          "polyc.backend", "polyc.tune", "polyc.compare", "polyc.search", "polyc.plot"}
LAYERS = ("polyc.frontend", "polyc.codegen")

#: modules that break a rule today: module name -> the reason (reported, not fixed)
KNOWN_VIOLATIONS: dict[str, str] = {}


def _violations(src: str, module: str, path: str) -> list[str]:
    bad = []
    for name in sorted(_imports(module, path)):
        top = _top(name)
        if top in ("frontend", "codegen"):
            bad.append(f"{name} (a source directory, not an installed package)")
        elif src == "polyc":
            if module not in WIRING and any(name == p or name.startswith(p + ".")
                                            for p in LAYERS):
                bad.append(name)
        else:
            own = SOURCE_ROOTS[src]
            if name == own or name.startswith(own + "."):
                continue
            if top == "polyc":
                if name not in ALLOWED_CORE[src]:
                    bad.append(name)
            elif top != "__future__" and top not in sys.stdlib_module_names \
                    and top not in THIRD_PARTY[src]:
                bad.append(f"{name} (third-party)")
    return bad


@pytest.mark.parametrize("src,module,path", [
    pytest.param(*m, id=m[1], marks=[pytest.mark.xfail(strict=True,
                                                      reason=KNOWN_VIOLATIONS[m[1]])]
                 if m[1] in KNOWN_VIOLATIONS else [])
    for m in MODULES])
def test_import_direction(src, module, path):
    bad = _violations(src, module, path)
    assert not bad, f"{module} ({os.path.relpath(path, ROOT)}) imports {bad}"


def test_import_rules_see_violations(tmp_path):
    """The checker itself: a frontend module importing the code generator, the scheduler
    or the top-level package, and a core module importing a frontend, are caught."""
    f = tmp_path / "bad_front.py"
    f.write_text("from polyc.codegen import generate_c\nfrom polyc.schedule import x\n"
                 "import polyc\nfrom ..options import Options\nfrom . import tc_parser\n"
                 "def g():\n    import cgen\n")
    bad = _violations("frontend", "polyc.frontend.bad_front", str(f))
    assert bad == ["cgen (third-party)", "polyc", "polyc.codegen", "polyc.options",
                   "polyc.schedule"], bad
    c = tmp_path / "bad_core.py"
    c.write_text("def f():\n    from .frontend import from_tc\n    import codegen\n")
    assert _violations("polyc", "polyc.deps", str(c)) == [
        "codegen (a source directory, not an installed package)", "polyc.frontend"]
    assert _violations("polyc", "polyc.api", str(c)) == [
        "codegen (a source directory, not an installed package)"]
