"""What a claim notebook needs in one call: resolved paths, published data, bundles, an output writer."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from IPython.display import Markdown, display

from ..analysis.captured import BundleRef, describe, find_bundles
from ..analysis.checks import check_table, run_checks
from ..analysis.outputs import Outputs
from ..analysis.published import PublishedClaim, load_published
from ..claims import get_claim
from ..paths import in_project


class ParameterError(ValueError):
    """A notebook parameter has the wrong type or value; the message names the notebook and the parameter."""


def check_parameters(values: dict, source: str = "notebook parameters") -> None:
    """Check the parameters papermill injected (alpha in (0, 1), n_boot and seed whole numbers, paths as text):
    ``check_parameters(globals(), "01-hpet.ipynb")`` in a notebook's first code cell after the parameters."""
    from .. import schemas

    known = schemas.NOTEBOOK_PARAMETERS["properties"]
    schemas.check({k: v for k, v in values.items() if k in known}, schemas.NOTEBOOK_PARAMETERS, source, ParameterError)


def resolve(path: str | Path) -> Path:
    """Notebook parameters are resolved against the repository root when relative (``paths.in_project``: for the
    project files a wheel carries, a path not among them, such as the default output_dir build/, in ~/ticklab)."""
    path = Path(path)
    return path if path.is_absolute() else in_project(path)


@dataclass
class ClaimContext:
    claim: str
    data_dir: Path
    published_dir: Path
    output_dir: Path
    published: PublishedClaim
    bundles: list[BundleRef]
    out: Outputs

    def fresh_data_summary(self) -> str:
        return describe(self.bundles, self.data_dir, self.claim)

    def forest_plot(self):
        """The claim's forest plot (analysis/forest.py) from the verdict rows this notebook wrote, read back as the
        report reads them (verdicts/<claim>.csv): written to figures/<claim>/forest and tables/<claim>/forest and
        shown; where no row has a CI, a sentence saying so. Drawn here, beside the claims' other notebooks, not after
        them in 00-summary."""
        from ..analysis import forest
        from .summary import collect_verdicts

        rows = collect_verdicts(self.output_dir, self.claim)
        if forest.has_lines(rows):
            forest.save_forest(rows, self.output_dir, self.data_dir)
        else:
            say(forest.no_forest_sentence(self.claim))

    @property
    def checks(self) -> tuple:
        """The claim's condition checks: its ``Claim.checks``, the one list of them."""
        return tuple(get_claim(self.claim).checks)

    def condition_checks(self):
        """The claim's condition checks over its bundles, written to checks/<claim>.csv (one row per setup,
        condition and check)."""
        return self.out.checks(check_table(run_checks(self.claim, self.checks, self.bundles)))


def open_claim(claim: str, data_dir: str | Path, published_dir: str | Path, output_dir: str | Path) -> ClaimContext:
    get_claim(claim)
    data, published, output = resolve(data_dir), resolve(published_dir), resolve(output_dir)
    output.mkdir(parents=True, exist_ok=True)
    return ClaimContext(
        claim=claim,
        data_dir=data,
        published_dir=published,
        output_dir=output,
        published=load_published(published, claim),
        bundles=find_bundles(data, claim),
        out=Outputs(output, claim),
    )


def say(text: str) -> None:
    """Show computed prose as Markdown in the notebook."""
    display(Markdown(text))
