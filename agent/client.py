"""The agent's control-plane client: the shared client (shared/client.py), re-exported."""

from shared.client import ControlPlane, ControlPlaneError, Refused, Unreachable

__all__ = ["ControlPlane", "ControlPlaneError", "Refused", "Unreachable"]
