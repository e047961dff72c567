"""What every view of the dashboard is built on, private to ``forge_nb.widgets``.

``series`` (the curves' data model and plotly figure), ``throttle`` (at most one redraw per interval),
``calls`` (a Run's control methods run on the kernel's event loop), ``errors`` (callback errors shown,
never swallowed), ``run`` (the ``RunView`` protocol: what the views use of a Run) and ``view`` (a live
widget displayed with its static HTML snapshot). Each is used by more than one view, so none lives in a
view's module; none of them imports panel.
"""
