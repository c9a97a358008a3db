"""The tree's rules, read from the source: the prepare wing never loads torch or the read wing,
no tokpack module imports itself back (function-local imports included), no caller type-checks an
encoder or a dataset, and no function is longer than a screen."""

from __future__ import annotations

import ast
import importlib
import json
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from helpers import ROOT
from tokpack._compat import MOVED
from tokpack.data.runtime import FORKSERVER_PRELOAD

PACKAGE = ROOT / "tokpack"
# The one place the torch-free side may load torch: joining torchrun's process group, inside a
# function, only when WORLD_SIZE > 1.
LAZY_TORCH = {"tokpack.distributed"}


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(node: ast.If) -> bool:
    return isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"


def _imports(path: Path, typing_too: bool = False) -> list[tuple[str, int, bool]]:
    """(imported module, line, at module level) for every import that runs, TYPE_CHECKING blocks aside
    unless ``typing_too`` (a package that names another's types stands on it)."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: list[tuple[str, int, bool]] = []

    def visit(node: ast.AST, top: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child) and not typing_too:
                continue
            if isinstance(child, ast.Import):
                found.extend((alias.name, child.lineno, top) for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    anchor = package.split(".")[: len(package.split(".")) - child.level + 1]
                    base = ".".join([*anchor, *([base] if base else [])])
                for alias in child.names:
                    # `from . import units` imports a module; `from .x import y` imports x.
                    full = f"{base}.{alias.name}"
                    found.append((full if _is_module(full) else base, child.lineno, top))
            nested = isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            visit(child, top and not nested)

    visit(ast.parse(path.read_text("utf-8")), True)
    return found


def _is_module(name: str) -> bool:
    parts = name.split(".")
    if parts[0] != "tokpack":
        return False
    path = ROOT.joinpath(*parts)
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _graph(typing_too: bool = False) -> dict[str, list[tuple[str, str, bool]]]:
    """module -> [(tokpack module it imports, 'file:line', at module level)]"""
    graph: dict[str, list[tuple[str, str, bool]]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        where = str(path.relative_to(ROOT))
        graph[_module_name(path)] = [(target, f"{where}:{line}", top) for target, line, top in
                                     _imports(path, typing_too)]
    return graph


def test_the_prepare_wing_and_the_ground_it_stands_on_never_import_torch_or_the_read_wing():
    graph = _graph()
    seen, todo = set(), [m for m in graph if m == "tokpack.prepare" or m.startswith("tokpack.prepare.")]
    problems = []
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        for target, where, top in graph[module]:
            if target == "torch" or target.startswith("torch."):
                if top or module not in LAZY_TORCH:
                    problems.append(f"{where}: {module} imports {target}")
            elif target == "tokpack.data" or target.startswith("tokpack.data."):
                problems.append(f"{where}: {module} imports {target}, the read wing")
            elif target in graph:
                todo.append(target)
    assert "tokpack.format" in seen and "tokpack.verify" in seen  # the walk reached the shared ground
    assert not problems, "\n".join(problems)


# The prepare wing's rooms in the order a run goes through them: a room may use those before it,
# never one after (the plan decides, the guard reads the plan, tokenizing reads the verdicts, the
# finish reads the units). The task contract and the run stand above the stages.
PREPARE_ROOMS = ("config", "memory", "plan", "guard", "tokenize", "publish", "tasks", "launches", "run")
EXECUTORS_MAY_USE = ("config", "memory", "tasks", "executors")  # the task contract alone


def _room(module: str) -> str | None:
    """A prepare module's room: its first name below ``tokpack.prepare`` (None for the package's face and command)."""
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[:2] == ["tokpack", "prepare"] and parts[2] != "__main__" else None


def test_the_prepare_stages_only_use_earlier_ones_and_executors_only_the_task_contract():
    problems = []
    for module, targets in _graph(typing_too=True).items():
        room = _room(module)
        if room is None:
            continue
        for target, where, _ in targets:
            used = _room(target)
            if used is None or used == room:
                continue
            if room == "executors":
                if used not in EXECUTORS_MAY_USE:
                    problems.append(f"{where}: the executor {module} uses {target}, not the task contract")
            elif used == "executors":
                if room != "launches":
                    problems.append(f"{where}: {module} uses the executors; only the launches start them")
            elif PREPARE_ROOMS.index(used) > PREPARE_ROOMS.index(room):
                problems.append(f"{where}: {module} ({room}) uses {target}, a later stage ({used})")
    assert not problems, "\n".join(problems)
    assert set(PREPARE_ROOMS) | {"executors", "__init__", "__main__"} >= \
        {p.stem if p.suffix == ".py" else p.name for p in (PACKAGE / "prepare").iterdir() if p.name != "__pycache__"}
    # The rule sees what it looks for.
    assert _room("tokpack.prepare.guard.match") == "guard" and _room("tokpack.prepare.__main__") is None


def test_no_tokpack_module_imports_itself_back():
    graph = _graph(typing_too=True)  # a circle through type-only imports is a circle of the design
    edges = {m: [(t, w) for t, w, _ in targets if t in graph and t != m] for m, targets in graph.items()}
    state: dict[str, int] = {}
    stack: list[tuple[str, str]] = []

    def walk(module: str) -> list[str] | None:
        state[module] = 1
        for target, where in edges[module]:
            stack.append((target, where))
            if state.get(target) == 1:
                start = next(i for i, (m, _) in enumerate(stack) if m == target)
                return [f"{w} imports {m}" for m, w in stack[start + 1:]]
            if target not in state:
                circle = walk(target)
                if circle:
                    return circle
            stack.pop()
        state[module] = 2
        return None

    for module in sorted(edges):
        if module not in state:
            stack[:] = [(module, "")]
            circle = walk(module)
            assert circle is None, "import circle:\n" + "\n".join(circle)


def _unit(module: str) -> str:
    """What a package-level rule sees of a module: its package below tokpack (or its top-level
    module); a command (``__main__``) stands above every package, a unit of its own."""
    return module if module.endswith(".__main__") else ".".join(module.split(".")[:2])


def test_no_package_imports_itself_back_and_nothing_imports_the_packages_face():
    graph = _graph(typing_too=True)  # a circle through type-only imports is a circle of the design
    edges: dict[str, dict[str, str]] = {}
    for module, targets in graph.items():
        for target, where, _ in targets:
            if target in graph and _unit(target) != _unit(module):
                edges.setdefault(_unit(module), {}).setdefault(_unit(target), where)
    problems = [f"{where}: {module} imports the package's face" for module, targets in graph.items()
                for target, where, _ in targets if target == "tokpack" and module != "tokpack"]
    for a, targets in edges.items():  # a circle between two packages, or through a third
        for b in targets:
            reach, todo = set(), [b]
            while todo:
                unit = todo.pop()
                if unit not in reach:
                    reach.add(unit)
                    todo.extend(edges.get(unit, ()))
            if a in reach:
                problems.append(f"{targets[b]}: {a} imports {b}, which leads back to {a}")
    assert not problems, "\n".join(problems)
    assert "tokpack.prepare" in edges and "tokpack.format" in edges["tokpack.prepare"]  # the rule sees packages
    assert "tokpack.tokenizer" in edges["tokpack.chat"]  # and type-only imports (chat names the Encoder)


STORE_LIBRARIES = ("fsspec", "s3fs", "gcsfs", "aiohttp", "huggingface_hub")  # what tokpack reads stores with


def _store_calls(tree: ast.AST) -> list[tuple[str, int]]:
    """(what, line) for every import of a store's library and every use of an attribute ``fs``."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(a.name, node.lineno) for a in node.names if a.name.split(".")[0] in STORE_LIBRARIES]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in STORE_LIBRARIES:
            found.append((node.module or "", node.lineno))
        elif isinstance(node, ast.Attribute) and node.attr == "fs":
            found.append(("attribute fs", node.lineno))
    return found


def test_only_the_storage_package_speaks_to_a_store():
    problems = [f"{path.relative_to(ROOT)}:{line} uses {what}" for path in sorted(PACKAGE.rglob("*.py"))
                if not _module_name(path).startswith("tokpack.storage")
                for what, line in _store_calls(ast.parse(path.read_text("utf-8")))]
    assert not problems, "\n".join(problems)
    # The rule sees what it looks for.
    assert [w for w, _ in _store_calls(ast.parse("import fsspec\nfrom s3fs import S3FileSystem\nstore.fs.cat(k)"))] \
        == ["fsspec", "s3fs", "attribute fs"]


def test_the_tree_shows_the_stages():
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(top) <= 15, top
    assert {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()} >= {"prepare", "data", "bench"}


def test_importing_the_prepare_wing_never_loads_torch_nor_jinja2_before_a_template_is_used():
    # The benches of the prepare wing start as its commands do: without torch's two seconds.
    code = ("import sys, tokpack.prepare, tokpack.prepare.__main__, tokpack.verify, tokpack.chat, tokpack.bench.__main__, "
            "tokpack.bench.prepare, tokpack.bench.chat, tokpack.bench.tokenizer, tokpack.bench.remote, tokpack.bench.dedup\n"
            "print('torch' in sys.modules, 'jinja2' in sys.modules)\n"
            "tokpack.chat.Template\nprint('jinja2' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False", "True"]


@pytest.mark.parametrize("name", FORKSERVER_PRELOAD)
def test_every_forkserver_preload_name_imports_without_a_warning(name):
    # The forkserver skips a name that fails to import without a word.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert importlib.import_module(name).__name__ == name


def test_old_module_paths_import_the_new_modules_with_a_deprecation_warning():
    # A fresh interpreter: an old path warns on its first import only.
    code = """
import importlib, json, sys, warnings
from tokpack._compat import MOVED
out = {}
for old, new in MOVED.items():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = importlib.import_module(old)
    out[old] = [[str(w.message) for w in caught if w.category is DeprecationWarning],
                module is importlib.import_module(new), module.__spec__.name]
print(json.dumps(out))
"""
    found = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                      check=True).stdout)
    assert set(found) == set(MOVED)
    for old, (messages, same, spec_name) in found.items():
        assert len(messages) == 1 and f"{old} is now {MOVED[old]}" in messages[0], old
        assert same and spec_name == MOVED[old], old


# Classes that stand behind an interface (tokenizer.Encoder, data.protocol.LoaderDataset): only
# their own module may ask for them by type.
INTERFACED = {"TiktokenEncoder": "tokpack.tokenizer.bpe", "HFEncoder": "tokpack.tokenizer.hf",
              "TokenWindows": "tokpack.data.windows", "PackedDocuments": "tokpack.data.packing",
              "DocumentDataset": "tokpack.data.documents", "MixedWindows": "tokpack.data.mixing",
              "LocalFolder": "tokpack.storage.local", "RemoteFolder": "tokpack.storage.remote"}
MAX_FUNCTION_LINES = 60


def _type_checks(tree: ast.AST) -> list[tuple[str, int]]:
    """(class name, line) for every class named in an ``isinstance`` or ``issubclass`` check."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("isinstance",
                                                                                              "issubclass"):
            kinds = node.args[1] if len(node.args) > 1 else ast.Tuple(elts=[])
            for name in kinds.elts if isinstance(kinds, ast.Tuple) else [kinds]:
                if isinstance(name, (ast.Name, ast.Attribute)):
                    found.append((name.id if isinstance(name, ast.Name) else name.attr, node.lineno))
    return found


def test_no_encoder_or_dataset_is_type_checked_outside_its_own_module():
    problems = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = _module_name(path)
        for name, line in _type_checks(ast.parse(path.read_text("utf-8"))):
            if name in INTERFACED and INTERFACED[name] != module:
                problems.append(f"{path.relative_to(ROOT)}:{line} type-checks {name}")
    assert not problems, "\n".join(problems)
    # The rule sees what it looks for.
    assert _type_checks(ast.parse("isinstance(e, (tokenizer.HFEncoder, int))")) == [("HFEncoder", 1), ("int", 1)]


def test_no_function_is_longer_than_a_screen():
    long = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text("utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} has {lines} lines")
    assert not long, "\n".join(long)
