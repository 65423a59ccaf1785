"""Reading traces: a capture's raw files (``rawfile``, xz or plain), trace.dat v6/v7 and tracefs captures as Arrow
tables (``ingest``, with the ring-buffer walk ``ringbuf`` and its C extension ``_ringbuf``), lost events
(``tracefs_stats``), a tracefs capture as trace.dat (``tracedat``), and what the tables give: per-run metrics
(``tracemetrics``), the cost of a tick (``tickcost``) and where ``ticklab view`` puts its markers (``tracespots``).

Imports nothing of the analysis (docs/ARCHITECTURE.md §1; tests/test_layers.py)."""
