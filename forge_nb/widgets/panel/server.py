"""The panel app served on 127.0.0.1: ``serve(run)`` returns a :class:`PanelServer` (``url``, ``stop()``).

Only who holds the URL gets in, as with Jupyter's ``?token=``: the server runs Bokeh's signed sessions
(``sign_sessions`` with a secret made for this server, ``generate_session_ids=False``), and the URL
carries a session id signed with that secret. A request without it, or with any other, is answered
403, and so is a websocket whose token is not signed with the secret (Bokeh checks both). Websockets
are accepted only from the server's own origin (127.0.0.1 or localhost on its port). Bokeh's own
mechanism was chosen over a hand-written request check (a tornado handler wrapper would have to cover
every route Bokeh and panel add) and over panel's ``basic_auth`` (a login form, with no link to click).

A served app ends with its run: ``serve`` listens to the run's metrics for the state event that
``run.shutdown()`` records ("shut down", as ``%forge_shutdown`` does it) and stops the server then,
from a thread of its own (stopping waits for the server's thread). ``server.stop()`` ends it earlier.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from forge_nb.widgets._shared.calls import kernel_loop
from forge_nb.widgets._shared.run import RunView
from forge_nb.widgets.controls import FINAL_STATES, run_summary
from forge_nb.widgets.panel.app import panel_app


@dataclass
class PanelServer:
    """A running panel server: ``url``, ``serving``, ``stop()``; it also stops when its run shuts down."""

    url: str
    """The app's address with its signed session id: keep it to yourself, as a Jupyter token."""
    port: int
    thread: threading.Thread
    _unsubscribe: Callable[[], None] | None = field(default=None, repr=False)
    _stopping: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def serving(self) -> bool:
        return self.thread.is_alive()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop serving and stop listening to the run; safe to call twice, and from any thread."""
        unsubscribe, self._unsubscribe = self._unsubscribe, None
        if unsubscribe is not None:
            unsubscribe()
        with self._stopping:  # panel refuses a second stop() while the first is under way
            stop = getattr(self.thread, "stop", None)
            if stop is not None and self.thread.is_alive():
                stop()
            self.thread.join(timeout)

    def _stop_when_shut_down(self, kind: str, row: dict[str, Any]) -> None:
        """Metrics observer (kernel thread): on the run's final state event, stop from another thread."""
        if kind == "event" and row.get("kind") == "state" and row.get("state") in FINAL_STATES:
            threading.Thread(target=self.stop, name=f"forge_nb.panel.stop.{self.port}", daemon=True).start()

    def _repr_html_(self) -> str:
        return f"<a href='{self.url}' target='_blank'>{self.url}</a>"


def serve(run: RunView, port: int = 0, show: bool = False, timeout: float = 30.0) -> PanelServer:
    """Serve the panel app of ``run`` on 127.0.0.1 (a free port when ``port=0``) from a thread; its ``url``
    holds the signed session id that lets a browser in (see the module docstring)."""
    import panel as pn

    state = run_summary(run)["state"]
    if state in FINAL_STATES:
        raise ValueError(f"serve(run): run {getattr(run, 'name', '')!r} is {state}; there is nothing left to show. "
                         "Spawn a new run (await forge_nb.spawn(config)) and serve that one")
    from bokeh.util.token import generate_secret_key, generate_session_id

    loop = kernel_loop()
    port = port or _free_port()
    secret = generate_secret_key().encode()
    session_id = generate_session_id(secret_key=secret, signed=True)
    url = f"http://127.0.0.1:{port}/?bokeh-session-id={session_id}"
    # show=False here: opening a browser must wait for the server, and needs the signed URL
    thread = pn.serve(lambda: panel_app(run, loop=loop), port=port, address="127.0.0.1",
                      websocket_origin=[f"127.0.0.1:{port}", f"localhost:{port}"], show=False,
                      sign_sessions=True, secret_key=secret, generate_session_ids=False,
                      threaded=True, verbose=False, title=f"forge_nb {getattr(run, 'name', '')}")
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if time.monotonic() > deadline or not thread.is_alive():
                raise RuntimeError(f"the panel server did not start on 127.0.0.1:{port} within {timeout}s; "
                                   "is the port taken? pass another port=") from None
            time.sleep(0.05)
    server = PanelServer(url=url, port=port, thread=thread)
    server._unsubscribe = run.metrics.subscribe(server._stop_when_shut_down)
    if show:
        import webbrowser

        webbrowser.open(url)
    return server


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
