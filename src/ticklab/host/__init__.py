"""The host: facts recorded in manifests, and the one place privileged writes are made and undone."""

from .facts import collect, host_id
from .journal import Change, HostChangeError, recover
from .knobs import HostChanges, Interrupted, interrupting_signals

__all__ = [
    "Change",
    "HostChangeError",
    "HostChanges",
    "Interrupted",
    "collect",
    "host_id",
    "interrupting_signals",
    "recover",
]
