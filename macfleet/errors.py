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
