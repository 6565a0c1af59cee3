"""The house's floors, checked statically (files are parsed, never imported; lazy and type-only
imports count, as in tests/test_import_cycles.py):

- the job runtime (engine/jobs) sits above search, the data builds and training: none of
  engine/search, engine/datasets, engine/train imports engine.jobs;
- the progress types (engine/progress.py) are the ground floor: they import nothing of the engine;
- only the store (engine/store) talks to a database driver (sqlite3, psycopg): every other module
  sees the store's own errors, so a driver's exception never escapes it;
- the tree (engine/tree_columns.py, engine/tree_nodes.py) is the ground floor, and the store
  never imports the search;
- the trainers share helpers through common modules, never through each other (sft does not import
  dpo), and only engine/train/trl_trainers.py imports TRL (imported lazily by the trainers);
- the data builds (engine/datasets) sit below the search: they read stored trees, never engine.search;
- the dashboard reaches the store through one module of its own (dashboard/store.py): no other
  dashboard module imports engine.store.
"""

from __future__ import annotations

import ast
from pathlib import Path

from test_import_cycles import ROOT, _imports, _modules, import_graph

BELOW_JOBS = ("engine.search", "engine.datasets", "engine.train")
DRIVERS = ("sqlite3", "psycopg", "psycopg2", "psycopg_pool")
DRIVER_SCAN = ("engine", "dashboard", "bench")


def _under(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def reaching(graph: dict[str, set[str]], below: str, above: str, allowed: tuple[str, ...] = ()) -> list[str]:
    """`module -> ABOVE...` for every module under `below` (but the `allowed` ones) that imports `above`."""
    return sorted(f"{m} -> {t}" for m, targets in graph.items() if _under(m, below) and m not in allowed
                  for t in targets if _under(t, above))


def jobs_importers(graph: dict[str, set[str]], above: str = "engine.jobs") -> list[str]:
    """`module -> ABOVE...` for every module below the job runtime (and the loop) that imports `above`."""
    return sorted(line for below in BELOW_JOBS for line in reaching(graph, below, above))


def driver_imports(path: Path) -> list[str]:
    """The database drivers `path` imports (anywhere in the file)."""
    return third_party_imports(path, DRIVERS)


def third_party_imports(path: Path, roots: tuple[str, ...]) -> list[str]:
    """The modules under `roots` (top-level names) that `path` imports, anywhere in the file."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names = [node.module or ""]
        else:
            continue
        found += [n for n in names if n.split(".")[0] in roots]
    return found


def test_the_finders_see_what_they_look_for(tmp_path: Path) -> None:
    graph = {"engine.train.x": {"engine.jobs.kinds"}, "engine.jobs.kinds": {"engine.train.x"}, "engine.cli": set()}
    assert jobs_importers(graph) == ["engine.train.x -> engine.jobs.kinds"]
    module = tmp_path / "m.py"
    module.write_text("def f():\n    import sqlite3\n    from psycopg import errors\n    import json\n")
    assert driver_imports(module) == ["sqlite3", "psycopg"]


def test_search_datasets_and_train_never_import_the_job_runtime() -> None:
    graph = import_graph()
    assert "engine.jobs.kinds" in graph and "engine.search.stage" in graph
    assert not jobs_importers(graph), "below engine.jobs, yet importing it: " + "; ".join(jobs_importers(graph))


def test_the_loop_sits_above_search_data_and_training() -> None:
    """engine.loop runs search, data builds, training and evaluation in turn: `train/` only trains."""
    graph = import_graph()
    assert "engine.loop" in graph and not any(_under(m, "engine.train.iterate") for m in graph)
    assert not jobs_importers(graph, "engine.loop"), "; ".join(jobs_importers(graph, "engine.loop"))


def test_the_progress_types_are_the_ground_floor() -> None:
    graph = import_graph()
    assert not {t for t in graph["engine.progress"] if _under(t, "engine")}


def test_only_the_store_imports_a_database_driver() -> None:
    offenders = []
    for package in DRIVER_SCAN:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT)
            if rel.parts[:2] == ("engine", "store"):
                continue
            offenders += [f"{rel}: {name}" for name in driver_imports(path)]
    assert not offenders, "database drivers imported outside engine/store: " + "; ".join(offenders)


TRL_MODULE = "engine/train/trl_trainers.py"


def test_sft_shares_helpers_with_dpo_through_common_modules_not_through_dpo() -> None:
    graph = import_graph()
    assert "engine.llm.tokens" in graph["engine.train.sft"] and "engine.train.selection" in graph["engine.train.sft"]
    assert "engine.train.dpo" not in graph["engine.train.sft"]


def test_only_the_trl_module_imports_trl(tmp_path: Path) -> None:
    probe = tmp_path / "m.py"
    probe.write_text("def f():\n    from trl.trainer.dpo_trainer import X\n    import trl\n    import trlx\n")
    assert third_party_imports(probe, ("trl",)) == ["trl.trainer.dpo_trainer", "trl"]
    assert third_party_imports(ROOT / TRL_MODULE, ("trl",)), f"{TRL_MODULE} no longer imports TRL"
    offenders = [f"{path.relative_to(ROOT)}: {name}" for package in ("engine", "dashboard")
                 for path in sorted((ROOT / package).rglob("*.py")) if path.relative_to(ROOT).as_posix() != TRL_MODULE
                 for name in third_party_imports(path, ("trl",))]
    assert not offenders, f"TRL imported outside {TRL_MODULE}: " + "; ".join(offenders)
    graph = import_graph()
    importers = sorted(m for m, targets in graph.items() if "engine.train.trl_trainers" in targets)
    assert importers == ["engine.train.dpo", "engine.train.sft"], importers
    for module in importers:  # lazily: inside the functions that train, so importing a trainer stays light
        tree = ast.parse((ROOT / (module.replace(".", "/") + ".py")).read_text(encoding="utf-8"))
        top = [n.module for n in tree.body if isinstance(n, ast.ImportFrom)]
        top += [a.name for n in tree.body if isinstance(n, ast.Import) for a in n.names]
        assert "engine.train.trl_trainers" not in top, f"{module} imports the TRL module at module level"


def driver_names(path: Path) -> list[str]:
    """The drivers `path` names without importing them (`x.sqlite3.Error`, a re-exported `sqlite3`)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Name) and node.id in DRIVERS:
            found.append(node.id)
        elif isinstance(node, ast.Attribute) and node.attr in DRIVERS:
            found.append(node.attr)
        elif isinstance(node, ast.ImportFrom) and any(alias.name in DRIVERS for alias in node.names):
            found += [alias.name for alias in node.names if alias.name in DRIVERS]
    return found


def test_nothing_outside_the_store_reaches_a_driver_through_another_module(tmp_path: Path) -> None:
    probe = tmp_path / "m.py"
    probe.write_text("from engine.store.connection import sqlite3\n"
                     "import engine.store.sqlite as s\n"
                     "try:\n    pass\nexcept s.sqlite3.Error:\n    pass\n")
    assert driver_names(probe) == ["sqlite3", "sqlite3"]
    offenders = [f"{path.relative_to(ROOT)}: {name}" for package in DRIVER_SCAN
                 for path in sorted((ROOT / package).rglob("*.py")) if path.relative_to(ROOT).parts[:2] != ("engine", "store")
                 for name in driver_names(path)]
    assert not offenders, "a database driver named outside engine/store (catch StoreError): " + "; ".join(offenders)


def test_the_stores_column_lists_name_only_the_schemas_columns() -> None:
    from engine.store import columns
    from engine.store.copy import known_columns

    schema = known_columns()
    assert set(columns.BY_TABLE) <= set(schema), set(columns.BY_TABLE) - set(schema)
    unknown = [f"{table}.{c}" for table, lists in columns.BY_TABLE.items() for cols in lists for c in cols
               if c not in schema[table]]
    assert not unknown, "column lists name columns the schema lacks: " + ", ".join(unknown)
    assert len(set(columns.PAIRS)) == len(columns.PAIRS) and "merge_key" in columns.PAIRS
    row = tuple(range(len(columns.JOBS)))
    assert columns.named(columns.JOBS, row)["cancel_requested"] == len(columns.JOBS) - 1


def test_the_search_never_reaches_up_into_training() -> None:
    """The value critic's inference half lives in engine/search/value_critic.py; the trainers sit above."""
    graph = import_graph()
    assert "engine.search.value_critic" in graph["engine.search.mcts"]
    up = reaching(graph, "engine.search", "engine.train")
    assert not up, "; ".join(up)


def test_the_tree_is_the_ground_floor_and_the_store_sits_below_the_search() -> None:
    """One tree (engine/tree_columns.py: the columns and the tree algorithms; engine/tree_nodes.py: the
    search's nodes, which hand out those columns) under the search, the store and the dashboard alike."""
    graph = import_graph()
    assert not {t for t in graph["engine.tree_columns"] if _under(t, "engine")}
    assert "engine.tree_columns" in graph["engine.tree_nodes"]
    up = sorted(t for t in graph["engine.tree_nodes"]
                if any(_under(t, p) for p in ("engine.search", "engine.store", "engine.datasets", "dashboard")))
    assert not up, "engine.tree_nodes imports from above: " + "; ".join(up)
    below = reaching(graph, "engine.store", "engine.search")
    assert not below, "the store imports the search: " + "; ".join(below)


def test_the_datasets_never_reach_up_into_the_search() -> None:
    """The data builds read stored trees (engine.tree_nodes, the store); what they share with the search,
    such as a step's text as the value critic reads it (`SearchTree.step_text`), lives on the ground floor."""
    graph = import_graph()
    assert "engine.datasets.prm" in graph and "engine.search.value_critic" in graph
    up = reaching(graph, "engine.datasets", "engine.search")
    assert not up, "engine.datasets imports the search: " + "; ".join(up)


DASHBOARD_STORE = "dashboard.store"  # the dashboard's one door to engine.store


def test_the_store_finder_sees_lazy_and_type_only_imports(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text("from typing import TYPE_CHECKING\n"
                     "from dashboard.store import Store\n"
                     "if TYPE_CHECKING:\n    from engine.store.records import RunInfo\n"
                     "def f():\n    from engine import store\n    import engine.store.credentials as c\n")
    modules = _modules()
    graph = {"dashboard.views.probe": _imports("dashboard.views.probe", probe, modules),
             DASHBOARD_STORE: {"engine.store"}, "engine.cli": {"engine.store"}}
    assert reaching(graph, "dashboard", "engine.store", allowed=(DASHBOARD_STORE,)) == [
        "dashboard.views.probe -> engine.store", "dashboard.views.probe -> engine.store.credentials",
        "dashboard.views.probe -> engine.store.records"]


def test_the_dashboard_reaches_the_store_through_one_module() -> None:
    """Pages, panels and the cached reads (dashboard/data.py) import the store's names from
    dashboard/store.py, never from engine.store."""
    graph = import_graph()
    assert "engine.store" in graph[DASHBOARD_STORE], f"{DASHBOARD_STORE} no longer imports engine.store"
    assert DASHBOARD_STORE in graph["dashboard.data"] and DASHBOARD_STORE in graph["dashboard.views.review"]
    others = reaching(graph, "dashboard", "engine.store", allowed=(DASHBOARD_STORE,))
    assert not others, f"dashboard modules importing engine.store (import from {DASHBOARD_STORE}): " + "; ".join(others)
