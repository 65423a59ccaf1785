"""ticklab: reproduce five Linux-kernel timekeeping, idle and locking performance claims."""

__version__ = "0.1.0"
