"""The package's import graph: no cycles, dependencies point one way, the
TensorFlow-only kernels are reached only through `dispatch`, and no file
of the project edits `sys.path`.

Imports are read from the source (`ast`), including those inside
functions, so a cycle that only closes at call time is caught too.
"""

import ast
import os
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = "keras_transformer"

# Lowest first. A module may import modules of its own rank or below, never
# above: the math, then the fast paths and their door, the layers, the model
# and its loss and schedule, then what uses the model. The facade ("") imports
# the TensorFlow-only names above it on first use (`importlib`, by name).
RANKS = [
    {"config", "tokenizer", "distribute", "startup", "malloc", "files"},
    {"ops"},
    {"kernels"},
    {"dispatch"},
    {"layers"},
    {"transformer", "losses", "r_drop", "schedules", "metrics", ""},  # "": the package's facade
    {"decoding", "data", "evaluation", "visualization", "streaming", "sentences"},
    {"run_directory"},  # where a run's files are; writes no checkpoint
    {"training"},
    {"export"},
    {"pipeline"},  # the training pipeline as a library: validation BLEU translates
    {"serving", "beam"},  # beam: the corpus pipeline, a command of its own
    {"cli"},
]


def _modules(root=ROOT):
    """`{dotted name: path}` of every module of the package under `root`."""
    found = {}
    for directory, _, files in os.walk(os.path.join(root, PACKAGE)):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(directory, name)
                dotted = os.path.relpath(path, root)[:-3].replace(os.sep, ".")
                found[dotted.removesuffix(".__init__")] = path
    return found


def _imports(path, modules):
    """The package's modules that the file at `path` imports, anywhere in it."""
    tree = ast.parse(open(path).read(), path)
    targets = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # `from a.b import c` imports `a.b.c` where that is a module.
            names = [f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in modules
                     else node.module for alias in node.names]
        else:
            continue
        targets.update(name for name in names if name in modules)
    return targets


def _graph(root=ROOT):
    modules = _modules(root)
    return {name: _imports(path, modules) for name, path in modules.items()}


def _rank(module):
    part = module.split(".")[1] if "." in module else ""
    for rank, parts in enumerate(RANKS):
        if part in parts:
            return rank
    raise AssertionError(f"{module} is in no rank of tests/test_imports.py RANKS: place it")


def test_no_relative_imports():
    # The checks below read absolute imports only.
    relative = [name for name, path in _modules().items()
                if any(isinstance(n, ast.ImportFrom) and n.level
                       for n in ast.walk(ast.parse(open(path).read())))]
    assert relative == []


def test_no_import_cycles():
    graph = _graph()
    state, cycles = {}, []

    def visit(module, stack):
        state[module] = "open"
        for target in sorted(graph[module]):
            if state.get(target) == "open":
                cycles.append(stack[stack.index(target):] + [target])
            elif target not in state:
                visit(target, stack + [target])
        state[module] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert cycles == [], "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_dependencies_point_one_way():
    upward = [f"{module} imports {target}"
              for module, targets in _graph().items() for target in targets
              if _rank(target) > _rank(module)]
    assert upward == []


def test_only_dispatch_reaches_the_kernels():
    reaching = [f"{module} imports {target}"
                for module, targets in _graph().items() for target in targets
                if target.startswith(f"{PACKAGE}.kernels")
                and not (module == f"{PACKAGE}.dispatch" or module.startswith(f"{PACKAGE}.kernels"))]
    assert reaching == []


def test_the_portable_math_uses_keras_only():
    """`ops/` is backend-neutral: no TensorFlow, no kernels, no layers."""
    graph, modules = _graph(), _modules()
    for module in (m for m in graph if m.startswith(f"{PACKAGE}.ops")):
        assert all(t.startswith(f"{PACKAGE}.ops") for t in graph[module]), module
        tree = ast.parse(open(modules[module]).read())
        imported = {alias.name.split(".")[0] for node in ast.walk(tree)
                    if isinstance(node, ast.Import) for alias in node.names}
        imported |= {node.module.split(".")[0] for node in ast.walk(tree)
                     if isinstance(node, ast.ImportFrom) and node.module}
        assert imported <= {"keras", "math", PACKAGE}, (module, imported)


def test_imports_inside_functions_are_read(tmp_path):
    # The reader itself: two modules importing each other, one of them only
    # inside a function, make an edge each way.
    package = tmp_path / PACKAGE
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "losses.py").write_text(f"def f():\n    from {PACKAGE} import metrics\n")
    (package / "metrics.py").write_text(f"from {PACKAGE}.losses import f\n")
    graph = _graph(str(tmp_path))
    assert graph[f"{PACKAGE}.losses"] == {f"{PACKAGE}.metrics"}
    assert graph[f"{PACKAGE}.metrics"] == {f"{PACKAGE}.losses"}


def test_no_file_edits_sys_path():
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.py"], cwd=ROOT, capture_output=True,
                           text=True, check=True).stdout.split()
    editing = [name for name in files if name != "tests/test_imports.py"
               and "sys.path." in open(os.path.join(ROOT, name)).read()]
    assert editing == []
