"""Live views of a Run: an ipywidgets dashboard in the notebook, and the same as a panel app.

    from forge_nb.widgets import dashboard, serve
    dashboard(run)                # controls, replica health, curves, episodes; refreshes by itself
    server = serve(run)           # the panel app on 127.0.0.1: server.url, server.stop()
    panel_app(run)                # the panel app as an object to display inline
    compare(run_a, run_b)         # several runs on the same curves, live

Widgets read ``run.metrics`` and ``service.status()`` and call the run's public control methods;
they never import monarch or the service layer. panel loads only when a panel app is made.

The views sit in this folder (``dashboard``, its sections ``controls``, ``health``, ``curves``, ``explorer``
and ``logs``, ``compare``, ``placement``, ``snapshot``); ``panel/`` is the standalone panel app and its
server; ``_shared/`` is the plumbing every view uses (the curves' data model, the throttle, calls on the
kernel's loop, the error log). The function ``dashboard`` shares its name with the module that defines it;
import module internals with ``from forge_nb.widgets.dashboard import ...``.
"""

from __future__ import annotations

from forge_nb.widgets.compare import Compare, compare
from forge_nb.widgets.dashboard import Dashboard, dashboard
from forge_nb.widgets.panel.app import panel_app
from forge_nb.widgets.panel.server import PanelServer, serve

__all__ = ["Compare", "Dashboard", "PanelServer", "compare", "dashboard", "panel_app", "serve"]
