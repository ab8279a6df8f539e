"""What a Flower process or the SuperLink failed to do, for the engines and the Control API client.

A module of its own so that :mod:`hetfed.engines.control_api` (Flower's HTTP client, imported only
when a run is watched) and :mod:`hetfed.engines.flower` (the processes) share the errors without
importing each other.
"""


class FlowerProcessError(RuntimeError):
    """A Flower process did not start, a run could not be submitted, or the SuperLink did not answer."""


class SuperLinkUnreachable(FlowerProcessError):
    """The SuperLink stopped answering ``/health`` while a run was being watched."""
