"""Opt-in alias: make `import caffe` (and `caffe.io`, `caffe.proto.caffe_pb2`, ...) mgcaffe.

pycaffe code runs unchanged once the alias is installed, in one of two ways:

    python -m mgcaffe.caffe_alias script.py ARGS...       # run a script with the alias
    python -m mgcaffe.caffe_alias -m unittest discover    # or a module (-m), as python -m

    import mgcaffe.caffe_alias
    mgcaffe.caffe_alias.install()                          # from Python, before `import caffe`

Then `import caffe`, `import caffe.io`, `from caffe import layers as L, params as P` and
`from caffe.proto import caffe_pb2` give mgcaffe's modules (`caffe.X` is `mgcaffe.X`).
Nothing is aliased unless asked for, and a real Caffe is never shadowed silently: when a
`caffe` package is importable from sys.path (or already imported), `install()` raises
ImportError naming it; `install(force=True)` (or `--force` on the command line) shadows it.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import runpy
import sys

ALIAS = "caffe"
TARGET = "mgcaffe"


class _AliasLoader(importlib.abc.Loader):
    """Loads `caffe.X` as the already importable `mgcaffe.X` (the same module object)."""

    def __init__(self, target: str):
        self.target = target

    def create_module(self, spec):
        module = importlib.import_module(self.target)
        self.own_spec = module.__spec__
        return module

    def exec_module(self, module):
        # Already executed; the import system replaced its __spec__ with the alias's:
        # give it back, so that mgcaffe's relative imports and reloads stay mgcaffe's.
        module.__spec__ = self.own_spec


class _AliasFinder(importlib.abc.MetaPathFinder):
    """Finds `caffe` and `caffe.*` as mgcaffe's modules."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != ALIAS and not fullname.startswith(ALIAS + "."):
            return None
        real = TARGET + fullname[len(ALIAS):]
        if importlib.util.find_spec(real) is None:
            return None
        is_package = hasattr(importlib.import_module(real), "__path__")
        return importlib.machinery.ModuleSpec(fullname, _AliasLoader(real),
                                              is_package=is_package)


def installed() -> bool:
    """Whether the alias is active in this process."""
    return any(isinstance(f, _AliasFinder) for f in sys.meta_path)


def real_caffe() -> str | None:
    """Where a real (non-mgcaffe) `caffe` package would be imported from, or None."""
    module = sys.modules.get(ALIAS)
    if module is not None:
        return None if getattr(module, "__name__", "") == TARGET else (
            getattr(module, "__file__", None) or "an imported module")
    spec = importlib.machinery.PathFinder.find_spec(ALIAS)
    if spec is None:
        return None
    return spec.origin or (list(spec.submodule_search_locations or []) or ["?"])[0]


def install(force: bool = False) -> None:
    """Make `import caffe` import mgcaffe (idempotent). Raises ImportError when a real
    Caffe is importable, unless `force`."""
    if installed():
        return
    other = real_caffe()
    if other is not None and not force:
        raise ImportError(f"a real Caffe is importable here ({other}); mgcaffe will not "
                          f"shadow it: remove it from sys.path/PYTHONPATH, or pass "
                          f"force=True (--force) to use mgcaffe as `caffe` anyway")
    for name in [n for n in sys.modules if n == ALIAS or n.startswith(ALIAS + ".")]:
        del sys.modules[name]
    sys.meta_path.insert(0, _AliasFinder())


def uninstall() -> None:
    """Remove the alias (and the `caffe` modules it imported) from this process."""
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _AliasFinder)]
    for name in [n for n in sys.modules if n == ALIAS or n.startswith(ALIAS + ".")]:
        if getattr(sys.modules[name], "__name__", "").startswith(TARGET):
            del sys.modules[name]


_USAGE = ("usage: python -m mgcaffe.caffe_alias [--force] (SCRIPT | -m MODULE) [ARGS...]\n"
          "Run a pycaffe script or module with `import caffe` resolving to mgcaffe.")


def main(argv: list[str] | None = None) -> int:
    """`python -m mgcaffe.caffe_alias [--force] (script.py | -m module) args...`."""
    args = list(sys.argv[1:] if argv is None else argv)
    force = False
    if args and args[0] == "--force":
        force, args = True, args[1:]
    if not args or args[0] in ("-h", "--help") or (args[0] == "-m" and len(args) < 2):
        print(_USAGE, file=sys.stderr)
        return 2
    try:
        install(force=force)
    except ImportError as exc:
        print(f"mgcaffe.caffe_alias: {exc}", file=sys.stderr)
        return 1
    if args[0] == "-m":
        sys.argv = [args[1], *args[2:]]
        runpy.run_module(args[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = list(args)
        sys.path.insert(0, str(__import__("pathlib").Path(args[0]).resolve().parent))
        runpy.run_path(args[0], run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main())
