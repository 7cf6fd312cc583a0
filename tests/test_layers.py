"""The import layers: ``flows`` -> ``tasks`` -> ``storage`` -> ``pipeline``, read from the source.

``pipeline/`` is the domain library (no IO, no Prefect, no MLflow), ``storage/`` every byte on
disk, ``tasks/`` one Prefect task module per stage, ``flows/`` the flows and the command line.
An import may only run down the layers, and no stage task imports another: what stages share
lives in ``pipeline/`` or ``storage/``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LAYERS = ("pipeline", "storage", "tasks", "flows")
"""From the bottom up: a package may import the packages below it, never those above."""
FORBIDDEN_LIBRARIES = {"pipeline": ("prefect", "mlflow")}
"""Libraries a layer may not import: the domain library runs without the orchestrator."""


def imported_modules(path: Path, root: Path = REPO) -> list[str]:
    """Every module ``path`` (under ``root``) imports, at any depth: absolute names, relative
    imports resolved against the file's package (``from . import x`` gives the package)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = ".".join(path.relative_to(root).with_suffix("").parts[:-1])
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                names.append(f"{base}.{node.module}" if node.module else base)
            else:
                names.append(node.module or "")
    return names


def sources(layer: str) -> list[Path]:
    return sorted((REPO / layer).rglob("*.py"))


def test_the_import_walk_sees_every_kind_of_import(tmp_path: Path) -> None:
    """The checker itself: plain, from-, nested and relative imports are all found, so that the
    layer tests below cannot pass by missing one."""
    (tmp_path / "tasks").mkdir()
    source = tmp_path / "tasks" / "probe.py"
    source.write_text(
        "import flows.cli\nfrom storage import layout\n"
        "def f():\n    from tasks.track import run_track\n\nfrom . import collect\nfrom .gaits import x\n"
    )
    assert sorted(imported_modules(source, tmp_path)) == ["flows.cli", "storage", "tasks", "tasks.gaits", "tasks.track"]


@pytest.mark.parametrize("layer", LAYERS)
def test_imports_run_down_the_layers(layer: str) -> None:
    above = LAYERS[LAYERS.index(layer) + 1 :]
    wrong = []
    for path in sources(layer):
        for name in imported_modules(path):
            top = name.split(".")[0]
            if top in above or top == "benchmarks" or top in FORBIDDEN_LIBRARIES.get(layer, ()):
                wrong.append(f"{path.relative_to(REPO)} imports {name}")
    assert wrong == []


def test_no_stage_task_imports_another() -> None:
    wrong = []
    for path in sources("tasks"):
        for name in imported_modules(path):
            if name == "tasks" or (name.startswith("tasks.") and name != f"tasks.{path.stem}"):
                wrong.append(f"{path.relative_to(REPO)} imports {name}")
    assert wrong == []
