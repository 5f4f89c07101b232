"""GPU units: nvidia-smi settings, the device plugin's sharing config, and MPS.

Facts from the team reference (k8s-sharing.md): the device plugin's config
file (``version: v1``) and MPS client limits (48 from compute capability 7.5,
else 16).

A timeslice or mps pool's sharing units are drain-gated (H4): a new ``replicas``
changes how many slots each GPU is cut into, and restarting the MPS control
daemon ends every MPS client on the host. Each names every GPU its config covers
(all the host's GPUs) in ``gpus``: the agent takes a change of it only once none
of them is booked.
"""

from collections.abc import Mapping, Sequence

from msgspec import UNSET

from shared.inventory import Gpu, Inventory
from shared.nodespec import RenderRefused, Unit
from shared.policy.model import Policy
from shared.render.text import (
    Yaml,
    command_unit,
    file_unit,
    service_unit,
    systemd_unit,
    yaml_document,
)

DEVICE_PLUGIN_CONF = "/etc/nvidia-device-plugin/config.yaml"
MPS_SERVICE = "better-compute-mps-control.service"
MPS_UNIT_FILE = f"/etc/systemd/system/{MPS_SERVICE}"
MPS_CONTROL = "/usr/bin/nvidia-cuda-mps-control"
# Clients find the daemon through the pipe directory: containers must mount it and
# set the same CUDA_MPS_PIPE_DIRECTORY. systemd creates both directories.
MPS_PIPE_DIRECTORY = "/run/nvidia-mps"
MPS_LOG_DIRECTORY = "/var/log/nvidia-mps"

COMPUTE_MODES = {
    "default": "DEFAULT",
    "exclusive-process": "EXCLUSIVE_PROCESS",
    "prohibited": "PROHIBITED",
}


def _label(gpu: Gpu) -> str:
    return f"GPU {gpu.index} ({gpu.name})"


def _watts(value: float) -> str:
    return f"{value:g}"


# --- nvidia-smi settings ---------------------------------------------------------


def gpu_setting_units(policy: Policy, inventory: Inventory) -> list[Unit]:
    """Persistence and compute mode for every GPU; the power limit per GPU, within its limit."""
    settings = policy.gpu
    if settings is UNSET:
        return []
    if not inventory.gpus:
        raise RenderRefused("gpu", "this host has no GPUs to apply gpu settings to")
    units = []
    if settings.persistenceMode is not UNSET:
        flag = "1" if settings.persistenceMode else "0"
        # GPU settings do not survive a reboot: the agent runs them again after each boot.
        units.append(
            command_unit("gpu/persistence-mode", ["nvidia-smi", "-pm", flag], every_boot=True)
        )
    if settings.computeMode is not UNSET:
        mode = COMPUTE_MODES[settings.computeMode]
        units.append(command_unit("gpu/compute-mode", ["nvidia-smi", "-c", mode], every_boot=True))
    if settings.powerLimitW is not UNSET:
        watts = settings.powerLimitW
        for gpu in inventory.gpus:
            # The board's range when NVML gives it; else the limit in force now, which the
            # policy may lower but not raise. A GPU that says nothing refuses for itself.
            highest = gpu.power_limit_max_w or gpu.power_limit_w
            if highest is not None and watts > highest:
                raise RenderRefused(
                    "gpu.powerLimitW",
                    f"{watts} W is above the {_watts(highest)} W limit of {_label(gpu)}",
                )
            if gpu.power_limit_min_w is not None and watts < gpu.power_limit_min_w:
                raise RenderRefused(
                    "gpu.powerLimitW",
                    f"{watts} W is below the {_watts(gpu.power_limit_min_w)} W minimum of {_label(gpu)}",
                )
            units.append(
                command_unit(
                    f"gpu/power-limit/{gpu.uuid}",
                    ["nvidia-smi", "-i", gpu.uuid, "-pl", str(watts)],
                    every_boot=True,
                )
            )
    return units


# --- sharing: the device plugin and MPS -------------------------------------------


def mps_client_limit(gpu: Gpu) -> int | None:
    """The MPS control daemon's client limit: 48 from CC 7.5, 16 below; None when unknown."""
    if not gpu.compute_capability:
        return None
    major, _, minor = gpu.compute_capability.partition(".")
    try:
        capability = (int(major), int(minor or 0))
    except ValueError:
        return None
    return 48 if capability >= (7, 5) else 16


def _device_plugin_unit(config: Mapping[str, Yaml], gpus: Sequence[str] = ()) -> Unit:
    """The device plugin's config; it reads it at start, so a new one takes a restart of it.

    With ``gpus`` (a sharing config: how many slots those GPUs are cut into) it needs a
    drain of them instead: slots booked under the old count cannot be kept (H4).
    """
    return file_unit(
        "sharing/device-plugin-config",
        DEVICE_PLUGIN_CONF,
        yaml_document(config),
        needs="drain" if gpus else "restart",
        gpus=gpus,
    )


def sharing_units(policy: Policy, sharing: str, inventory: Inventory) -> list[Unit]:
    """timeslice/mps: replicas per GPU in the device plugin (S1); mig: the mixed strategy."""
    if not inventory.gpus:
        return []  # nothing to share; gpu settings, not sharing, refuse a GPU-less host
    if sharing == "mig":
        # mixed: MIG devices are advertised per profile, whole GPUs stay nvidia.com/gpu.
        return [_device_plugin_unit({"version": "v1", "flags": {"migStrategy": "mixed"}})]
    if sharing not in ("timeslice", "mps"):
        return []
    if policy.replicas is UNSET:
        raise RenderRefused("replicas", f"a {sharing} pool needs replicas (2 to 48)")
    replicas = policy.replicas
    if sharing == "mps":
        for gpu in inventory.gpus:
            if gpu.mig_current:
                # The device plugin refuses MPS on MIG devices (k8s-sharing.md).
                raise RenderRefused(
                    "replicas", f"MPS cannot share GPU {gpu.index} ({gpu.name}): it is in MIG mode"
                )
            limit = mps_client_limit(gpu)
            if limit is not None and replicas > limit:
                raise RenderRefused(
                    "replicas",
                    f"MPS takes at most {limit} clients on GPU {gpu.index} ({gpu.name}, "
                    f"compute capability {gpu.compute_capability}); replicas is {replicas}",
                )
    strategy = "timeSlicing" if sharing == "timeslice" else "mps"
    config: dict[str, Yaml] = {
        "version": "v1",
        "sharing": {
            strategy: {
                # Pods keep asking for nvidia.com/gpu; GFD marks the product -SHARED.
                "renameByDefault": False,
                # Two slots of one GPU give no more compute than one: such a request is
                # a mistake, refused at admission rather than silently granted.
                "failRequestsGreaterThanOne": True,
                "resources": [{"name": "nvidia.com/gpu", "replicas": replicas}],
            }
        },
    }
    covered = [gpu.uuid for gpu in inventory.gpus]  # the plugin shares every GPU alike
    units = [_device_plugin_unit(config, covered)]
    if sharing == "mps":
        units += _mps_units(replicas, inventory.gpus)
    return units


def _mps_units(replicas: int, gpus: Sequence[Gpu]) -> list[Unit]:
    """The MPS control daemon, splitting each GPU's SMs and memory evenly, as the plugin's does."""

    def control(command: str) -> str:
        return f"/bin/sh -c 'echo {command} | {MPS_CONTROL}'"

    service: list[tuple[str, str]] = [
        ("Type", "forking"),
        ("Environment", f"CUDA_MPS_PIPE_DIRECTORY={MPS_PIPE_DIRECTORY}"),
        ("Environment", f"CUDA_MPS_LOG_DIRECTORY={MPS_LOG_DIRECTORY}"),
        ("RuntimeDirectory", MPS_PIPE_DIRECTORY.removeprefix("/run/")),
        ("LogsDirectory", MPS_LOG_DIRECTORY.removeprefix("/var/log/")),
        ("ExecStart", f"{MPS_CONTROL} -d"),
        ("ExecStartPost", control(f"set_default_active_thread_percentage {100 // replicas}")),
    ]
    for gpu in gpus:
        if gpu.memory_bytes:
            share = gpu.memory_bytes // replicas // 2**20
            service.append(
                (
                    "ExecStartPost",
                    control(f"set_default_device_pinned_mem_limit {gpu.index} {share}M"),
                )
            )
    service += [("ExecStop", control("quit")), ("Restart", "on-failure")]
    text = systemd_unit(
        {
            "Unit": [
                (
                    "Description",
                    f"Better Compute: NVIDIA MPS control daemon ({replicas} clients per GPU)",
                ),
                ("After", "nvidia-persistenced.service"),
            ],
            "Service": service,
            "Install": [("WantedBy", "multi-user.target")],
        }
    )
    # Restarting the control daemon ends every MPS client on the host: drain first. The
    # service is gated too: a new unit file restarts it, and so would a unit file that
    # waits for the drain (its key covers the file's), ending the clients all the same.
    covered = [gpu.uuid for gpu in gpus]
    return [
        file_unit(
            "sharing/mps-unit-file",
            MPS_UNIT_FILE,
            text,
            needs="drain",
            restarts=[MPS_SERVICE],
            gpus=covered,
        ),
        service_unit("sharing/mps-service", MPS_SERVICE, needs="drain", gpus=covered),
    ]
