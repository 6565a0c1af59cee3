"""A search tree as the files `orchard export tree` writes (JSON `orchard.tree/1`, GraphML), in memory: one
exporter for the CLI and the dashboard's download buttons."""

from __future__ import annotations

import io
import json

from engine.store.records import RunInfo
from engine.tree_nodes import SearchTree


def tree_json(tree: SearchTree, info: RunInfo) -> str:
    """The tree with its run (id, env, model, config) as `orchard.tree/1` JSON; Q with the run's alpha."""
    run = {"id": info.id, "env": info.env, "model": info.model, "config": info.config}
    return json.dumps(tree.to_json(run, info.config.get("alpha", 0.5)), indent=1)


def tree_graphml(tree: SearchTree, info: RunInfo) -> bytes:
    """The tree as GraphML (networkx), node attributes N, Q~, Q^, Q (the run's alpha)."""
    import networkx as nx

    buffer = io.BytesIO()
    nx.write_graphml(tree.to_networkx(info.config.get("alpha", 0.5)), buffer)
    return buffer.getvalue()
