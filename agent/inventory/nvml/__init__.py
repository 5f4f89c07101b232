"""GPUs, MIG instances and GPU health from NVML, behind one seam: a module-like ``nvml`` object.

``api`` is the seam (the pynvml surface, the real module's loader, the calls
wrapped with their error handling); ``facts`` reads what one GPU is; ``health``
holds the verdict rule and its signals; ``events`` the XID event set; ``session``
the NVML session that a collection runs in, held across the agent's cycles.
Importing the package initialises nothing.
"""

from agent.inventory.nvml.api import NvmlApi, load_pynvml, text
from agent.inventory.nvml.events import EVENT_DRAIN_CAP
from agent.inventory.nvml.health import HEALTH_FILE, SKIP_XIDS
from agent.inventory.nvml.session import NvmlSession, collect_gpus

__all__ = [
    "EVENT_DRAIN_CAP",
    "HEALTH_FILE",
    "SKIP_XIDS",
    "NvmlApi",
    "NvmlSession",
    "collect_gpus",
    "load_pynvml",
    "text",
]
