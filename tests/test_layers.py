"""The package's layers (docs/design.md, "Layers"): no module imports from a layer below it
in the list, i.e. nothing reaches up, so there are no import cycles between layers. The
installed packages (``dspark_compile``, ``dspark_compile_vllm``) never import the
checkout's research package (``dspark_research``) nor reach into the checkout by path."""

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "dspark_compile"
INSTALLED = ("dspark_compile", "dspark_compile_vllm")
RESEARCH = "dspark_research"

# Lower number = lower layer; a module may import only from its own layer or lower ones.
LAYERS = {
    "validation": 0,
    "config": 0,
    "arithmetic": 1,
    "kernels": 2,
    "ops": 3,
    "models": 4,
    "passes": 5,
    "runtime": 6,
    "options": 7,
    "backend": 7,
    "routes": 7,
    "integrations.vllm": 7,
    "tools": 8,
    "testing": 8,
    "__main__": 8,
    "integrations.depyf_dump": 8,
    "__init__": 9,
}


def _layer(module: str) -> int:
    parts = module.split(".")
    for i in range(len(parts), 0, -1):
        if ".".join(parts[:i]) in LAYERS:
            return LAYERS[".".join(parts[:i])]
    raise AssertionError(f"module dspark_compile.{module} has no layer: add it to LAYERS")


def _imports(path: Path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "dspark_compile":
                for alias in node.names:
                    yield alias.name
            elif node.module.startswith("dspark_compile."):
                yield node.module[len("dspark_compile.") :]
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("dspark_compile."):
                    yield alias.name[len("dspark_compile.") :]


def test_no_module_imports_from_a_higher_layer():
    violations = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = ".".join(path.relative_to(PACKAGE).with_suffix("").parts)
        module = module.removesuffix(".__init__") if module != "__init__" else module
        for imported in _imports(path):
            if _layer(imported) > _layer(module):
                violations.append(
                    f"{module} (layer {_layer(module)}) imports {imported} "
                    f"(layer {_layer(imported)})"
                )
    assert not violations, "\n".join(violations)


def _module_name(path: Path) -> str:
    module = ".".join(path.relative_to(PACKAGE).with_suffix("").parts)
    return module.removesuffix(".__init__") if module != "__init__" else module


def _imported_modules(path: Path, modules: set[str]):
    """Modules ``path`` imports anywhere (lazy imports too): ``from pkg import sub`` names
    ``pkg.sub`` when that is a module; a name inside a module names the module."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "dspark_compile" or node.module.startswith("dspark_compile."):
                base = node.module[len("dspark_compile.") :] if "." in node.module else ""
                for alias in node.names:
                    sub = f"{base}.{alias.name}" if base else alias.name
                    yield sub if sub in modules else (base or "__init__")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("dspark_compile."):
                    yield alias.name[len("dspark_compile.") :]


def test_no_import_cycles():
    """No chain of imports (lazy ones too) leads from a module back to itself."""
    paths = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph = {m: set(_imported_modules(p, set(paths))) - {m} for m, p in paths.items()}
    cycles, state = [], {}

    def visit(module: str, stack: list[str]) -> None:
        state[module] = "open"
        for dep in sorted(graph[module] & set(paths)):
            if state.get(dep) == "open":
                cycles.append(" -> ".join(stack[stack.index(dep) :] + [dep]))
            elif dep not in state:
                visit(dep, stack + [dep])
        state[module] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert not cycles, "\n".join(cycles)


def research_imports(source: str) -> list[str]:
    """The ``dspark_research`` modules ``source`` imports, anywhere in it (lazily too)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        found += [n for n in names if n == RESEARCH or n.startswith(RESEARCH + ".")]
    return found


def _installed_files():
    for package in INSTALLED:
        yield from sorted((ROOT / package).rglob("*.py"))


def test_the_installed_packages_never_import_the_research_package():
    violations = {
        str(path.relative_to(ROOT)): research_imports(path.read_text())
        for path in _installed_files()
    }
    assert {k: v for k, v in violations.items() if v} == {}


@pytest.mark.parametrize(
    "source",
    [
        "from dspark_research.speculative.loop import SpeculativeDecoder\n",
        "def f():\n    import dspark_research.pair_demo\n",
        "import dspark_research\n",
    ],
)
def test_negative_control_a_research_import_is_caught(source):
    assert research_imports(source)
    assert not research_imports(source.replace("dspark_research", "dspark_compile"))


def reaches_out(path: Path, package_root: Path) -> list[int]:
    """``parents[N]`` of ``Path(__file__)`` in ``path`` that leave ``package_root``."""
    depth = len(path.relative_to(package_root).parts) - 1  # parents[depth] = package_root
    text = path.read_text()
    found = [int(n) for n in re.findall(r"__file__\)\.resolve\(\)\.parents\[(\d+)\]", text)]
    return [n for n in found if n > depth]


def test_the_installed_packages_do_not_reach_into_the_checkout():
    """A wheel holds no ``benchmarks/``, ``tests_engine/`` or research code: no module of
    it finds files above its own package by ``Path(__file__).parents``."""
    violations = {
        str(path.relative_to(ROOT)): reaches_out(path, ROOT / path.relative_to(ROOT).parts[0])
        for path in _installed_files()
    }
    assert {k: v for k, v in violations.items() if v} == {}


def test_negative_control_reaching_into_the_checkout_is_caught(tmp_path):
    module = tmp_path / "dspark_compile" / "tools" / "x.py"
    module.parent.mkdir(parents=True)
    module.write_text('P = Path(__file__).resolve().parents[2] / "benchmarks"\n')
    assert reaches_out(module, tmp_path / "dspark_compile") == [2]
    module.write_text("P = Path(__file__).resolve().parents[1]\n")  # the package itself
    assert reaches_out(module, tmp_path / "dspark_compile") == []


def test_the_wheel_does_not_package_the_research_code():
    """``[tool.setuptools.packages.find]`` of pyproject.toml selects the installed packages
    only (a wheel built from it holds no ``dspark_research``)."""
    import setuptools

    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        tomllib = pytest.importorskip("tomli")
    find = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    found = setuptools.find_packages(str(ROOT), **find["packages"]["find"])
    assert {p.split(".")[0] for p in found} == set(INSTALLED), found
    assert RESEARCH in setuptools.find_packages(str(ROOT))  # control: it is a package here
