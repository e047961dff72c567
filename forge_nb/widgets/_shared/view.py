"""LiveView: how a live widget object displays: the widget itself, with a static HTML snapshot beside it."""

from __future__ import annotations

from typing import Any


class LiveView:
    """Displays ``self.widget``; viewers without a widget manager (nbconvert, GitHub) get ``self.to_html()``.
    A subclass sets ``widget`` and defines ``to_html``."""

    widget: Any

    def _ipython_display_(self) -> None:
        from IPython.display import display

        bundle = self.widget._repr_mimebundle_()
        bundle["text/html"] = self.to_html()  # type: ignore[attr-defined]  # the subclass's snapshot
        display(bundle, raw=True)

    def _repr_html_(self) -> str:
        return self.to_html()  # type: ignore[attr-defined, no-any-return]
