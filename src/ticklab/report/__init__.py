"""What ``ticklab report`` and the notebooks show (docs/ARCHITECTURE.md §6): the notebooks' side (``notebook``:
``open_claim``), the summary (``summary``), running every notebook and writing the offline report (``build``:
``run_report``, the ``papermill_engine``, ``templates/``), the output directory's ownership (``outdir``), and the
``ticklab compare`` and ``ticklab view`` commands' work (``compare``, ``view``).

The top floor below the commands: nothing under capture/, lab/, trace/ or analysis/ imports it
(tests/test_layers.py)."""
