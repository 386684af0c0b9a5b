"""The per-host side of a job: the agent (``python -m macfleet.workers.agent``) and the
bootstrap every training process starts through."""
