"""The module paths of tokpack 0.1, importable for one more release, each with a DeprecationWarning.

    python -W default -c "import tokpack.windows"     # DeprecationWarning: now tokpack.data.windows

An old path names the very module at its new home (one object, so pickles and ``isinstance``
keep working); no file per old name clutters the tree.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings
from types import ModuleType
from typing import Any

# The prepare wing's modules as they were before its rooms (0.2), and where each now lives.
_PREPARE = {"units": "publish.ledger", "cluster": "plan.shares", "folder": "publish.folder", "writers": "tokenize.writers",
            "chats": "tokenize.chats", "signatures": "guard.signatures", "match": "guard.match", "holdout": "plan.holdout",
            "mixture": "plan.mixture", "input_hash": "plan.input_hash", "remote": "publish.remote", "process": "memory",
            "launch": "config.launch"}
MOVED = {
    **{f"tokpack.{name}": f"tokpack.data.{name}"
       for name in ("runtime", "samplers", "permutation", "windows", "documents", "mixing", "streams", "loader")},
    **{f"tokpack.{old}": f"tokpack.prepare.{new}" for old, new in _PREPARE.items() if old in ("units", "folder", "writers", "cluster")},
    **{f"tokpack.prepare.{old}": f"tokpack.prepare.{new}" for old, new in _PREPARE.items()},
    "tokpack.preparation": "tokpack.prepare.run",
    "tokpack.gpt": "tokpack.models",
    "tokpack.config": "tokpack.options",
    "tokpack.bench_loops": "tokpack.bench.loops",
    "tokpack.bench_peers": "tokpack.bench.peers",
}


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self) -> None:
        self._specs: dict[str, Any] = {}

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        return importlib.util.spec_from_loader(name, self) if name in MOVED else None

    def create_module(self, spec: Any) -> ModuleType:
        new = MOVED[spec.name]
        # warnings skips the import machinery's frames: level 2 is the import statement.
        warnings.warn(f"{spec.name} is now {new}; import it from there (the old path goes in tokpack 0.3)",
                      DeprecationWarning, stacklevel=2)
        module = importlib.import_module(new)
        self._specs[spec.name] = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        # The machinery stamped the old name's spec on the module; it stays the module of its new home.
        module.__spec__ = self._specs.pop(module.__spec__.name)


def install() -> None:
    if not any(isinstance(finder, _MovedModules) for finder in sys.meta_path):
        sys.meta_path.append(_MovedModules())
