"""Cluster units: the kubeadm join (P7) and pre-pulled images (U3)."""

import re

from msgspec import UNSET

from shared.inventory import Inventory
from shared.nodespec import RenderRefused, Unit
from shared.policy.model import Policy
from shared.render.text import command_unit, file_unit, yaml_document

JOIN_CONF = "/etc/kubernetes/better-compute-join.yaml"
# kubeadm 1.31 introduced v1beta4 and deprecated v1beta3; a fleet joining today runs 1.31+.
KUBEADM_API = "kubeadm.k8s.io/v1beta4"
DEFAULT_API_PORT = 6443


def api_server_endpoint(api_server: str) -> str:
    """kubeadm's host:port from the policy's URL (``https://k8s.example:6443/``)."""
    endpoint = api_server.removeprefix("https://").rstrip("/")
    if not re.search(r"(?<!:):[0-9]{1,5}$", endpoint) or endpoint.endswith("]"):
        endpoint = f"{endpoint}:{DEFAULT_API_PORT}"
    return endpoint


def kubernetes_units(policy: Policy, inventory: Inventory) -> list[Unit]:
    """A JoinConfiguration (it holds the bootstrap token: 0600) and one `kubeadm join`.

    The kubelet needs nothing more for the NVIDIA device plugin: device plugins are
    always on and register through the default socket directory.
    """
    kubernetes = policy.kubernetes
    if kubernetes is UNSET:
        return []
    if kubernetes.apiServer is UNSET or kubernetes.token is UNSET or kubernetes.caCertHash is UNSET:
        missing = next(
            name
            for name in ("apiServer", "token", "caCertHash")
            if getattr(kubernetes, name) is UNSET
        )
        raise RenderRefused(
            f"kubernetes.{missing}",
            "the kubernetes join set needs apiServer, token and caCertHash together",
        )
    endpoint = api_server_endpoint(kubernetes.apiServer)
    config = yaml_document(
        {
            "apiVersion": KUBEADM_API,
            "kind": "JoinConfiguration",
            "discovery": {
                "bootstrapToken": {
                    "apiServerEndpoint": endpoint,
                    "token": kubernetes.token,
                    "caCertHashes": [kubernetes.caCertHash],
                }
            },
            # kubeadm's own default: an RFC 1123 name, so a host called "GPU-01" still joins.
            "nodeRegistration": {"name": inventory.hostname.lower()},
        }
    )
    return [
        *kubelet_prerequisite_units(),
        file_unit("kubernetes/join-config", JOIN_CONF, config, mode=0o600),
        # Needs nothing: joining adds a node with no pods yet and kubeadm starts the
        # kubelet itself; a drain or restart would only disturb what runs here now.
        # The note names the cluster and not the token, so a rotated token does not
        # re-run a join that has already happened (kubeadm would refuse it); moving
        # to another cluster does.
        command_unit(
            "kubernetes/join",
            ["kubeadm", "join", "--config", JOIN_CONF],
            note=f"join {endpoint} as {inventory.hostname.lower()}",
        ),
    ]


KUBE_MODULES_CONF = "/etc/modules-load.d/better-compute-kubernetes.conf"
KUBE_SYSCTL_CONF = "/etc/sysctl.d/90-better-compute-kubernetes.conf"
KUBE_MODULES = ("overlay", "br_netfilter")
KUBE_SYSCTLS = (
    ("net.bridge.bridge-nf-call-iptables", "1"),
    ("net.bridge.bridge-nf-call-ip6tables", "1"),
    ("net.ipv4.ip_forward", "1"),
)


def kubelet_prerequisite_units() -> list[Unit]:
    """What kubeadm's preflight and the kubelet need on a fresh host (kubeadm's install guide):
    overlay and br_netfilter loaded, bridged traffic seen by iptables, forwarding, no swap."""
    modules = "".join(f"{name}\n" for name in KUBE_MODULES)
    sysctls = "".join(f"{key} = {value}\n" for key, value in KUBE_SYSCTLS)
    return [
        file_unit("kubernetes/modules-file", KUBE_MODULES_CONF, modules),
        *(
            Unit(id=f"kubernetes/module/{name}", kind="module", content=name)
            for name in KUBE_MODULES
        ),
        file_unit("kubernetes/sysctl-file", KUBE_SYSCTL_CONF, sysctls),
        *(
            Unit(id=f"kubernetes/sysctl/{key}", kind="sysctl", content=f"{key}={value}")
            for key, value in KUBE_SYSCTLS
        ),
        # The kubelet refuses to start with swap on; swap comes back at boot from fstab.
        command_unit("kubernetes/swapoff", ["swapoff", "-a"], every_boot=True),
    ]


def prewarm_units(policy: Policy) -> list[Unit]:
    """One pull per image through the CRI, so the first pod does not wait for it."""
    images = policy.prewarmImages
    if images is UNSET:
        return []
    return [
        command_unit(f"prewarm-images/{image}", ["crictl", "pull", image])
        for image in dict.fromkeys(images)
    ]
