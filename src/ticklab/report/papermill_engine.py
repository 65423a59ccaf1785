"""A papermill engine (`papermill --engine ticklab …`) that talks to its kernel over encrypted ZeroMQ.

ipykernel 7.4 warns on every start that "Kernel is running over TCP without encryption" unless the
kernel manager asks for CurveZMQ, and jupyter_client 8.10 leaves that off by default; papermill's
own command line has no way to ask. The kernel is local either way: the point is a clean stderr,
so that a warning a notebook does print is seen.
"""

from __future__ import annotations

from jupyter_client.manager import KernelManager
from papermill.engines import NBClientEngine


class EncryptedKernelManager(KernelManager):
    def __init__(self, **kwargs):
        kwargs.setdefault("transport_encryption", "auto")
        super().__init__(**kwargs)


class TicklabEngine(NBClientEngine):
    @classmethod
    def execute_managed_notebook(cls, nb_man, kernel_name, **kwargs):
        # a kernel manager class, not an instance: nbclient then owns the kernel and shuts it down
        return super().execute_managed_notebook(nb_man, kernel_name, kernel_manager_class=EncryptedKernelManager,
                                                **kwargs)
