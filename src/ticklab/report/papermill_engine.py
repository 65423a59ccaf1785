"""A papermill engine (`papermill --engine ticklab …`) that talks to its kernel over encrypted ZeroMQ, and runs the
notebooks' own kernel, ``ticklab``, wherever papermill runs.

ipykernel 7.4 warns on every start that "Kernel is running over TCP without encryption" unless the
kernel manager asks for CurveZMQ, and jupyter_client 8.10 leaves that off by default; papermill's
own command line has no way to ask. The kernel is local either way: the point is a clean stderr,
so that a warning a notebook does print is seen.

The notebooks declare the ``ticklab`` kernelspec, the one ``make kernelspec`` (and ``make jupyter``) installs into
the environment as "Python (ticklab)". Where it is not installed (a fresh ``make env``, CI, a plain ``pip install``),
this engine runs ``ticklab`` as the interpreter papermill runs in, as ipykernel's own ``python3`` kernel would, so
``papermill --engine ticklab`` and ``ticklab report`` need no kernelspec installed.
"""

from __future__ import annotations

import os

from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel
from jupyter_client.manager import KernelManager
from papermill.engines import NBClientEngine
from traitlets import default

from . import kernelfork

KERNEL_NAME = "ticklab"
KERNEL_DISPLAY_NAME = "Python (ticklab)"  # as `make kernelspec` installs it


class TicklabKernelSpecs(KernelSpecManager):
    """The installed kernelspecs, and ``ticklab`` as the running interpreter where none of that name is installed."""

    def get_kernel_spec(self, kernel_name: str):
        try:
            return super().get_kernel_spec(kernel_name)
        except NoSuchKernel:
            if kernel_name.lower() != KERNEL_NAME:
                raise
        from ipykernel.kernelspec import RESOURCES, get_kernel_dict  # argv: [sys.executable, -m, ipykernel_launcher …]

        spec = get_kernel_dict()
        spec["display_name"] = KERNEL_DISPLAY_NAME
        return self.kernel_spec_class(resource_dir=RESOURCES, **spec)


class EncryptedKernelManager(KernelManager):
    def __init__(self, **kwargs):
        kwargs.setdefault("transport_encryption", "auto")
        super().__init__(**kwargs)

    def format_kernel_cmd(self, extra_arguments=None):
        # under ticklab report: a kernel forked from the report's fork server, imports done (report/kernelfork.py)
        # an address inherited from elsewhere is not used: only a socket of ours in a private directory of ours
        # (kernelfork.started's), and the client checks the server's uid again before it hands it anything
        return kernelfork.kernel_command(
            super().format_kernel_cmd(extra_arguments),
            kernelfork.trusted_address(os.environ.get(kernelfork.SOCKET_ENV)),
        )

    async def _async_interrupt_kernel(self) -> None:
        # jupyter_client 8 interrupts a kernel before it asks it to shut down. papermill shuts a kernel down once its
        # last cell has replied, so the interrupt has nothing to stop, but on a loaded machine it can land while the
        # kernel is still inside a message handler (its SIGINT handler is Python's then), and the kernel logs
        # "KeyboardInterrupt caught in kernel." on stderr. The shutdown request alone ends an idle kernel; a kernel
        # stuck in a cell is ended by the manager's own terminate and kill after shutdown_wait_time.
        if self.shutting_down:
            return
        await super()._async_interrupt_kernel()

    @default("kernel_spec_manager")
    def _ticklab_kernel_specs(self) -> KernelSpecManager:
        return TicklabKernelSpecs(data_dir=self.data_dir)


def project_error(nb) -> str | None:
    """The one line of a cell that stopped on ticklab's ProjectError (no project directory, or one that is not a
    checkout), or None: a missing project is the user's setting, not a bug, so it is said without the traceback."""
    for number, cell in enumerate(nb.cells):
        for output in cell.get("outputs", []):
            if output.get("output_type") == "error" and output.get("ename") == "ProjectError":
                return f"ticklab: {output.get('evalue', '')} (cell {number})"
    return None


class TicklabEngine(NBClientEngine):
    @classmethod
    def execute_managed_notebook(cls, nb_man, kernel_name, **kwargs):
        # a kernel manager class, not an instance: nbclient then owns the kernel and shuts it down
        done = super().execute_managed_notebook(
            nb_man, kernel_name, kernel_manager_class=EncryptedKernelManager, **kwargs
        )
        missing = project_error(nb_man.nb)
        if missing:  # papermill would end in a 40-line PapermillExecutionError; the notebook is saved already
            raise SystemExit(missing)
        return done
