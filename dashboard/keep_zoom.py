"""The Tree explorer's zoom, kept across the redraws that bring a live search's new nodes.

WHY a script: Streamlit (1.67) keys a plotly chart's element by an id hashed from the figure, so a
figure with new nodes mounts a new chart, and plotly's `layout.uirevision` (which keeps the zoom when
one chart's figure changes) never sees the old chart. This script, emitted once on the page, remembers
the axis ranges of each explorer plot in the browser tab, per `uirevision` (`revision`: one per tree,
so another run or task starts from the full view), and puts them back on the next chart that carries
the same revision. A double-click (plotly's autorange: the full view) forgets them. The script is a
constant (no data of any kind goes into it); it only reads plotly's own plot divs.
"""

from __future__ import annotations

import streamlit as st

PREFIX = "explorer-tree-"

# window.Plotly: set by the plotly.js bundle Streamlit loads with its first chart. gd.on / gd.layout /
# Plotly.relayout are plotly's public API on a plot div.
SCRIPT = """<script>
(() => {
  if (window.orchardKeptZoom) return;  // once per browser tab: the page may mount this again
  const kept = window.orchardKeptZoom = {};  // uirevision -> {x: [lo, hi], y: [lo, hi]}
  const PREFIX = "__PREFIX__";
  setInterval(() => {
    if (!window.Plotly) return;
    for (const gd of document.querySelectorAll(".js-plotly-plot")) {
      const rev = gd.layout && gd.layout.uirevision;
      if (gd.orchardZoomHooked || typeof rev !== "string" || !rev.startsWith(PREFIX) || !gd.on) continue;
      gd.orchardZoomHooked = true;
      const range = kept[rev];
      if (range) window.Plotly.relayout(gd, {"xaxis.range": range.x, "yaxis.range": range.y});
      gd.on("plotly_relayout", () => {
        const x = gd.layout.xaxis || {}, y = gd.layout.yaxis || {};
        if (x.autorange || y.autorange || !x.range || !y.range) delete kept[rev];
        else kept[rev] = {x: x.range.slice(), y: y.range.slice()};
      });
    }
  }, 200);
})();
</script>""".replace("__PREFIX__", PREFIX)


def revision(tree_id: int) -> str:
    """The explorer figure's `uirevision`: the same on every redraw of one tree, another per tree."""
    return f"{PREFIX}{tree_id}"


def keep_zoom() -> None:
    """Emit the script (outside the live fragment, so a fragment rerun leaves it mounted)."""
    st.html(SCRIPT, unsafe_allow_javascript=True)
