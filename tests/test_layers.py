"""The package's layers (docs/design.md, "Layers"): no module imports from a layer below it
in the list, i.e. nothing reaches up, so there are no import cycles between layers."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "dspark_compile"

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
    "speculative": 8,
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
