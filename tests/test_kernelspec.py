"""The notebooks' kernel (issue 41, item 7): every notebook declares the "ticklab" kernelspec that `make kernelspec`
installs, and papermill's ticklab engine runs it as its own interpreter where no such kernelspec is installed."""

import json
import re
import sys

import nbformat
import papermill  # noqa: F401  (first: papermill's entry points import the engine module)
import pytest
from jupyter_client.kernelspec import NoSuchKernel

from conftest import REPO
from ticklab.report.papermill_engine import KERNEL_DISPLAY_NAME, KERNEL_NAME, TicklabKernelSpecs

NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))


def test_make_kernelspec_installs_the_kernel_the_engine_names():
    target = re.search(r"^kernelspec:.*\n\t(.*)$", (REPO / "Makefile").read_text(), re.M).group(1)
    assert f'--name {KERNEL_NAME} --display-name "{KERNEL_DISPLAY_NAME}"' in target


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name)
def test_every_notebook_declares_the_ticklab_kernel(notebook):
    book = nbformat.read(notebook, as_version=4)
    assert book.metadata["kernelspec"] == {
        "name": KERNEL_NAME,
        "display_name": KERNEL_DISPLAY_NAME,
        "language": "python",
    }


def test_a_missing_ticklab_kernelspec_is_the_running_interpreter(tmp_path):
    specs = TicklabKernelSpecs(kernel_dirs=[str(tmp_path)])
    spec = specs.get_kernel_spec(KERNEL_NAME)
    assert spec.argv[:3] == [sys.executable, "-m", "ipykernel_launcher"] and spec.display_name == KERNEL_DISPLAY_NAME
    with pytest.raises(NoSuchKernel):
        specs.get_kernel_spec("no-such-kernel")
    # an installed one (make kernelspec) is used as it is
    (tmp_path / KERNEL_NAME).mkdir()
    (tmp_path / KERNEL_NAME / "kernel.json").write_text(
        json.dumps(
            {
                "argv": ["/opt/elsewhere/python", "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                "display_name": KERNEL_DISPLAY_NAME,
                "language": "python",
            }
        )
    )
    assert specs.get_kernel_spec(KERNEL_NAME).argv[0] == "/opt/elsewhere/python"
