"""The statistics and verdicts shared by every claim (docs/ARCHITECTURE.md §5): the published numbers
(``published``), a claim's bundles under a data directory (``captured``), condition checks (``checks``), ratio
intervals and tests (``stats``), power (``power``), the verdict rule (``verdicts``), the comparisons that join them
(``comparisons``), what a notebook writes (``outputs``) and the forest plots (``forest``).

Reads bundles; capture and lab import none of it but ``stats`` (the stopping rule checks the CI the verdict will),
and it imports no report (tests/test_layers.py)."""
