"""A run's life: its parts built (``build``, ``on_base`` for a run on another's base), owned and closed in one order
(``assembly``), and what a shutdown leaves and waits for (``teardown``)."""
