"""Live views of a Run: an ipywidgets dashboard in the notebook, and the same as a panel app.

    from forge_nb.widgets import dashboard, serve
    dashboard(run)                # controls, replica health, curves, episodes; refreshes by itself
    server = serve(run)           # the panel app on 127.0.0.1: server.url, server.stop()
    panel_app(run)                # the panel app as an object to display inline
    compare(run_a, run_b)         # several runs on the same curves, live

Widgets read ``run.metrics`` and ``service.status()`` and call the run's public control methods;
they never import monarch or the service layer. panel loads only when a panel app is made.

The functions ``dashboard`` and ``panel_app`` share their names with the modules that define them;
import module internals with ``from forge_nb.widgets.dashboard import ...``.
"""

from __future__ import annotations

from forge_nb.widgets.compare import Compare, compare
from forge_nb.widgets.dashboard import Dashboard, dashboard
from forge_nb.widgets.panel_app import panel_app
from forge_nb.widgets.panel_server import PanelServer, serve

__all__ = ["Compare", "Dashboard", "PanelServer", "compare", "dashboard", "panel_app", "serve"]
