"""The ``macfleet`` command: ``macfleet launch`` and the job coordinator."""
