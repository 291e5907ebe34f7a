"""The import contract: data flows one way (prototxt -> Net -> Solver -> communication), and
the imports show it. Read from the source (ast), so a violation fails here before it ships.

docs/design.md draws the same floors; a new module goes on the floor of its folder.

The size budget, which can only shrink, is here too: a module you can read in one sitting, a
class small enough to read at once, a folder whose listing tells what it holds. Today's
exceptions are listed by name with their current size; growth past an entry fails, and so
does a shrink that leaves the entry behind (lower it, or remove it once the thing fits).
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "mgcaffe"

#: (module prefix, floor): a module may import only modules on its own floor or below. The
#: longest matching prefix decides.
FLOORS = [
    ("mgcaffe.errors", 0), ("mgcaffe.log", 0), ("mgcaffe._launch", 0), ("mgcaffe.proto", 0),
    ("mgcaffe.caffe_alias", 0), ("mgcaffe.seeding", 0),
    ("mgcaffe.backend", 1), ("mgcaffe.formats", 1), ("mgcaffe.blob", 1), ("mgcaffe.fillers", 1),
    ("mgcaffe.data", 2), ("mgcaffe.cpu", 2), ("mgcaffe.comm.model", 2),
    ("mgcaffe.kernels", 3), ("mgcaffe.comm.backends", 3),
    ("mgcaffe.layer_types", 4), ("mgcaffe.comm.runtime", 4),
    ("mgcaffe.net", 5), ("mgcaffe.comm.training", 5),
    ("mgcaffe.solvers", 6),
    # pycaffe's own modules, and the package that offers pycaffe's API
    ("mgcaffe", 7),
    ("mgcaffe.commands", 8),
    ("mgcaffe.cli", 9), ("mgcaffe.__main__", 9),
]

#: importer prefix -> prefixes it must never import, whatever the floors allow.
FORBIDDEN = {
    # the model is pure: no communicator, no thread, no engine
    "mgcaffe.comm.model": ["mgcaffe.comm.backends", "mgcaffe.comm.runtime",
                           "mgcaffe.comm.training", "mgcaffe.net", "mgcaffe.cpu",
                           "mgcaffe.layer_types", "mpi4py", "threading", "cupy"],
    "mgcaffe.comm.backends": ["mgcaffe.comm.runtime", "mgcaffe.comm.training"],
    "mgcaffe.comm.runtime": ["mgcaffe.comm.training"],
    # communication never imports the engine or the solver: it gets them passed in
    "mgcaffe.comm": ["mgcaffe.solvers", "mgcaffe.net", "mgcaffe.layer_types",
                     "mgcaffe.kernels", "mgcaffe.data"],
    "mgcaffe.layer_types": ["mgcaffe.net", "mgcaffe.solvers", "mgcaffe.comm"],
    # a layer's path choice is a pure function: no runner, no thread, no array of a layer
    "mgcaffe.layer_types.choice": ["mgcaffe.cpu", "mgcaffe.blob", "mgcaffe.backend",
                                   "mgcaffe.layer_types.base", "threading", "cupy"],
    "mgcaffe.kernels": ["mgcaffe.layer_types", "mgcaffe.data"],
    "mgcaffe.cpu": ["mgcaffe.kernels", "mgcaffe.comm"],
    "mgcaffe.net": ["mgcaffe.comm"],
    "mgcaffe.solvers": ["mgcaffe.comm"],
}

#: Third-party modules that may be imported inside a function (optional at run time, or MPI,
#: which a lone process must not start); everything else is imported at the top.
LAZY_ALLOWED = {"cupy", "cupyx", "h5py", "numba", "matplotlib", "pydot", "PIL", "mpi4py",
                "lmdb", "plyvel"}


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in PACKAGE.rglob("*.py") if "proto" not in p.parts}


def _top_level_ids(tree: ast.Module) -> set[int]:
    ids: set[int] = set()

    def visit(body):
        for node in body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                ids.add(id(node))
            elif isinstance(node, (ast.If, ast.Try)):
                visit(node.body)
                for handler in getattr(node, "handlers", []):
                    visit(handler.body)
                visit(node.orelse)

    visit(tree.body)
    return ids


def _imports(name: str, path: Path, modules: dict) -> list[tuple[str, bool]]:
    """(imported module, at top level) for every import statement of the module; names
    inside the package resolve to the module that defines them."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    top = _top_level_ids(tree)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, id(node) in top) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1]
                                + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            for alias in node.names:
                full = f"{base}.{alias.name}"
                found.append((full if full in modules else base, id(node) in top))
    return found


@functools.cache
def _edges() -> list[tuple[str, str, bool]]:
    modules = _modules()
    return [(name, target, top) for name, path in modules.items()
            for target, top in _imports(name, path, modules)]


def _floor(module: str) -> int | None:
    best = None
    for prefix, floor in FLOORS:
        if module == prefix or module.startswith(prefix + "."):
            if best is None or len(prefix) > len(best[0]):
                best = (prefix, floor)
    return None if best is None else best[1]


def _within(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def test_every_module_has_a_floor():
    assert [m for m in _modules() if _floor(m) is None] == []


def test_every_import_points_down():
    up = [f"{a} (floor {_floor(a)}) imports {b} (floor {_floor(b)})"
          for a, b, _ in _edges() if _within(b, "mgcaffe") and _floor(b) > _floor(a)]
    assert up == []


@pytest.mark.parametrize("importer", sorted(FORBIDDEN))
def test_forbidden_imports(importer):
    bad = [f"{a} imports {b}" for a, b, _ in _edges() if _within(a, importer)
           for banned in FORBIDDEN[importer] if _within(b, banned)]
    assert bad == []


def test_no_import_cycles():
    graph: dict[str, set[str]] = {}
    for a, b, _ in _edges():
        if _within(b, "mgcaffe") and a != b:
            graph.setdefault(a, set()).add(b)
    state: dict[str, int] = {}
    cycles = []

    def visit(node, stack):
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                cycles.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, stack)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [])
    assert cycles == []


def test_commands_do_not_import_each_other():
    # what several commands share lives in commands/_*.py (helpers, not commands)
    bad = [f"{a} imports {b}" for a, b, _ in _edges()
           if _within(a, "mgcaffe.commands") and _within(b, "mgcaffe.commands")
           and b != "mgcaffe.commands" and not b.rsplit(".", 1)[1].startswith("_")]
    assert bad == []


def test_function_level_imports_are_only_optional_dependencies():
    lazy = sorted({f"{a}: {b}" for a, b, top in _edges()
                   if not top and b.split(".")[0] not in LAZY_ALLOWED})
    assert lazy == []


def test_the_checks_see_a_violation(tmp_path):
    # the contract is read from source: a layer type importing the net must be caught
    layer = PACKAGE / "layer_types" / "accuracy.py"
    modules = _modules()
    assert ("mgcaffe.net", True) not in _imports("mgcaffe.layer_types.accuracy", layer, modules)
    fake = tmp_path / "accuracy.py"
    fake.write_text(layer.read_text() + "\nfrom ..net import Net\n")
    found = _imports("mgcaffe.layer_types.accuracy", fake, modules)
    assert ("mgcaffe.net", True) in found
    assert _floor("mgcaffe.net") > _floor("mgcaffe.layer_types.accuracy")


# ----------------------------------------------------------------------- the size budget
MODULE_LINES = 700
CLASS_LINES = 450
CLASS_ATTRIBUTES = 30  # distinct `self.x` an instance's methods assign
FOLDER_MODULES = 12  # modules in one folder, __init__ not counted

#: folders that are registries: one module per entry, by design
REGISTRIES = {"mgcaffe/layer_types", "mgcaffe/commands"}

#: path -> lines, for modules over MODULE_LINES today
MODULE_EXCEPTIONS: dict[str, int] = {}
#: "path:Class" -> (lines, attributes), for classes over either budget today
CLASS_EXCEPTIONS = {
    "mgcaffe/comm/training/trainer.py:DistributedTraining": (398, 34),
}
#: folder -> modules, for folders over FOLDER_MODULES today (the package's top holds
#: pycaffe's own module names beside the ground floor)
FOLDER_EXCEPTIONS = {
    "mgcaffe": 16,
    "mgcaffe/comm/training": 16,
}


def _relative(path: Path) -> str:
    return path.relative_to(PACKAGE.parent).as_posix()


def _sources() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "proto" not in p.parts)


def module_sizes() -> dict[str, int]:
    """path -> lines, for every module of the package."""
    return {_relative(p): len(p.read_text(encoding="utf-8").splitlines()) for p in _sources()}


def class_sizes() -> dict[str, tuple[int, int]]:
    """"path:Class" -> (lines, distinct self attributes assigned in its body)."""
    out = {}
    for p in _sources():
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                attrs = {n.attr for n in ast.walk(node)
                         if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store)
                         and isinstance(n.value, ast.Name) and n.value.id == "self"}
                out[f"{_relative(p)}:{node.name}"] = (node.end_lineno - node.lineno + 1,
                                                      len(attrs))
    return out


def folder_sizes() -> dict[str, int]:
    """folder -> modules directly in it (not __init__.py)."""
    folders = {p.parent for p in _sources()}
    return {_relative(d): sum(1 for p in d.glob("*.py") if p.name != "__init__.py")
            for d in folders}


def _judge(sizes: dict, exceptions: dict, over, what: str) -> list[str]:
    problems = []
    for name, size in sorted(sizes.items()):
        listed = exceptions.get(name)
        if listed is None:
            if over(size):
                problems.append(f"{name}: {what} {size} is over the budget; split it by role")
        elif size != listed:
            verb = "grew" if any(s > l for s, l in zip(_tuple(size), _tuple(listed))) \
                else "shrank"
            fix = ("split it by role" if verb == "grew" else
                   "remove its entry" if not over(size) else f"lower its entry to {size}")
            problems.append(f"{name}: {what} {verb} from {listed} to {size}; {fix}")
    for name in sorted(set(exceptions) - set(sizes)):
        problems.append(f"{name}: listed as an exception but gone; remove its entry")
    return problems


def _tuple(x) -> tuple:
    return x if isinstance(x, tuple) else (x,)


def test_modules_fit_the_budget():
    assert not _judge(module_sizes(), MODULE_EXCEPTIONS, lambda n: n > MODULE_LINES,
                      "lines")


def test_classes_fit_the_budget():
    problems = _judge(class_sizes(), CLASS_EXCEPTIONS,
                      lambda s: s[0] > CLASS_LINES or s[1] > CLASS_ATTRIBUTES,
                      "(lines, attributes)")
    assert not problems


def test_folders_fit_the_budget():
    sizes = {k: v for k, v in folder_sizes().items() if k not in REGISTRIES}
    assert not _judge(sizes, FOLDER_EXCEPTIONS, lambda n: n > FOLDER_MODULES, "modules")


def test_the_budget_sees_growth_and_a_stale_entry():
    over = lambda n: n > 10  # noqa: E731
    assert _judge({"a.py": 11}, {}, over, "lines") == [
        "a.py: lines 11 is over the budget; split it by role"]
    assert "grew from 12 to 13" in _judge({"a.py": 13}, {"a.py": 12}, over, "lines")[0]
    assert "lower its entry to 11" in _judge({"a.py": 11}, {"a.py": 12}, over, "lines")[0]
    assert "remove its entry" in _judge({"a.py": 9}, {"a.py": 12}, over, "lines")[0]
    assert "gone" in _judge({}, {"b.py": 12}, over, "lines")[0]
    pair = lambda s: s[0] > 450 or s[1] > 30  # noqa: E731
    assert "grew" in _judge({"c": (400, 32)}, {"c": (400, 31)}, pair, "x")[0]
