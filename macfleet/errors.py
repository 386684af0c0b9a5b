"""The errors macfleet raises. Catch ``MacfleetError`` to catch them all."""

from __future__ import annotations


class MacfleetError(RuntimeError):
    """Base class of every error macfleet raises on purpose."""


class ConfigError(MacfleetError, ValueError):
    """A user mistake: a bad argument, environment variable or dtype."""


class RendezvousError(MacfleetError):
    """The processes of a job could not find or reach each other."""


class PeerLost(MacfleetError):
    """Another rank of the job died or stopped answering.

    ``rank`` is the lost rank where it is known, else ``None``.
    """

    def __init__(self, message: str, rank: int | None = None) -> None:
        super().__init__(message)
        self.rank = rank


class CollectiveTimeout(MacfleetError):
    """A collective made no progress before its deadline."""


class JobAborted(MacfleetError):
    """The launcher aborted the job (another rank failed, or the user stopped it)."""


class ProtocolError(MacfleetError):
    """Two ranks disagree about a collective (different sizes, dtypes or order)."""


class UnevenInputs(MacfleetError):
    """Inside ``DataParallel.join(throw_on_early_termination=True)``, a rank ran out of
    batches: raised on every rank at the same step, so that all leave their loops together."""


def warn_at_script(message: str) -> None:
    """``warnings.warn(message)``, shown at the line of the script that led to it (the first
    caller outside macfleet and torch) rather than at macfleet's own: a sampler is iterated
    from inside torch's DataLoader, a DataParallel's forward from inside ``nn.Module``."""
    import os
    import sys
    import warnings

    packages = (sys.modules.get("macfleet"), sys.modules.get("torch"))
    inside = tuple(os.path.dirname(p.__file__) + os.sep for p in packages if p is not None and p.__file__)
    frame, level = sys._getframe(1), 2
    while frame is not None and frame.f_code.co_filename.startswith(inside):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, stacklevel=level)
