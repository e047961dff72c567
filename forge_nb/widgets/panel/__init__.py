"""The dashboard as a standalone panel app: ``app`` builds it from the views' pieces, ``server`` serves it.

``app`` lays out the same status, controls, health, curves and episodes as the notebook dashboard with
panel widgets, and hands work between the server's thread and the kernel's event loop; ``server`` runs it
on 127.0.0.1 behind a signed session URL and stops it when the run shuts down. panel is imported only
inside their functions, so importing ``forge_nb.widgets`` does not load it.
"""
