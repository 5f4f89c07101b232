"""The provision module's pool-policy validator: host units as nodes would get them.

The NodeSpec renderer joins here: it will render the policy against
representative inventories of the pool's GPU model and refuse what no node
can take.
"""

from msgspec import UNSET

from shared.mig import layout_fits, profiles_for
from shared.nodespec import RenderRefused
from shared.policy.model import cpu_ranges
from shared.policy.validate import PolicyContext, PolicyViolation

SHARED_SLOTS = ("timeslice", "mps")


def validate_kernel_modules(ctx: PolicyContext) -> None:
    modules = ctx.policy.kernelModules
    if modules is UNSET:
        return
    both = sorted(set(modules.load) & set(modules.blacklist))
    if both:
        raise PolicyViolation("kernelModules", f"module {both[0]} is both loaded and blacklisted")


def validate_cpu(ctx: PolicyContext) -> None:
    cpu = ctx.policy.cpu
    if cpu is UNSET or cpu.isolate is UNSET:
        return
    previous = -1
    for low, high in cpu_ranges(cpu.isolate):
        if low > high or low <= previous:
            raise PolicyViolation("cpu.isolate", "CPU ranges must ascend without overlap")
        previous = high
    if cpu_ranges(cpu.isolate)[0][0] == 0:
        raise PolicyViolation("cpu.isolate", "CPU 0 keeps the host running and cannot be isolated")


def validate_kubernetes(ctx: PolicyContext) -> None:
    """The kubeadm join set is all or none; on a platform site it needs platformOperated (P7)."""
    kubernetes = ctx.policy.kubernetes
    if kubernetes is UNSET:
        return
    missing = [
        name for name in ("apiServer", "token", "caCertHash") if getattr(kubernetes, name) is UNSET
    ]
    if missing:
        raise PolicyViolation(
            f"kubernetes.{missing[0]}",
            "the kubernetes join set needs apiServer, token and caCertHash together",
        )
    if ctx.site_kind != "custom" and ctx.policy.platformOperated is not True:
        raise PolicyViolation(
            "platformOperated",
            "a kubernetes join set on a platform site needs platformOperated: true",
        )


def validate_sharing(ctx: PolicyContext) -> None:
    """Time-slice and MPS pools split each GPU into `replicas` slots (2…48); others take none (S1)."""
    replicas = ctx.policy.replicas
    if ctx.sharing in SHARED_SLOTS and replicas is UNSET:
        raise PolicyViolation("replicas", f"a {ctx.sharing} pool needs replicas (2 to 48)")
    if ctx.sharing not in SHARED_SLOTS and replicas is not UNSET:
        raise PolicyViolation("replicas", "replicas applies only to timeslice and mps pools")
    if ctx.sharing in SHARED_SLOTS and ctx.pool_class == "vps-host":
        raise PolicyViolation("replicas", "vps-host pools do not share GPUs in slots")
    gpu = ctx.policy.gpu
    if (
        ctx.sharing in SHARED_SLOTS
        and gpu is not UNSET
        and gpu.computeMode in ("exclusive-process", "prohibited")
    ):
        raise PolicyViolation(
            "gpu.computeMode",
            f"{gpu.computeMode} leaves no room for the {ctx.sharing} slots sharing a GPU",
        )


def validate_mig_layout(ctx: PolicyContext) -> None:
    """Every profile exists for the pool's gpuModel, and each GPU's layout fits one GPU (U3)."""
    layout = ctx.policy.migLayout
    if layout is UNSET:
        return
    if ctx.sharing != "mig":
        raise PolicyViolation("migLayout", "migLayout applies only to mig pools")
    if not ctx.gpu_model:
        raise PolicyViolation("migLayout", "migLayout needs the pool's gpuModel")
    known = profiles_for(ctx.gpu_model)
    if not known:
        raise PolicyViolation("migLayout", f"{ctx.gpu_model} GPUs do not support MIG")
    for key, profiles in layout.items():
        for profile in profiles:
            if profile not in known:
                raise PolicyViolation(
                    f"migLayout.{key}", f"profile {profile} does not exist on {ctx.gpu_model}"
                )
        if not layout_fits(ctx.gpu_model, profiles):
            raise PolicyViolation(
                f"migLayout.{key}", f"{' + '.join(profiles)} does not fit on one {ctx.gpu_model}"
            )


def validate_gpu(ctx: PolicyContext) -> None:
    if ctx.policy.gpu is not UNSET and not ctx.gpu_model:
        raise PolicyViolation("gpu", "gpu settings need the pool's gpuModel")


def validate_as_rendered(ctx: PolicyContext) -> None:
    """P6: render the policy as nodes would get it, on representative hosts of the pool's model.

    Refused when no such host can take it (huge pages beyond any host's memory, a power
    limit above every GPU's, a MIG profile no variant has…); a joining host that cannot
    take a policy others can is quarantined with the reason instead.
    """
    # Imported here: shared.render imports the policy model, whose package imports this module.
    from shared.render import render, representative_inventories

    refusals: list[tuple[RenderRefused, str]] = []
    for inventory in representative_inventories(ctx.gpu_model):
        try:
            render(
                ctx.policy,
                sharing=ctx.sharing,
                gpu_model=ctx.gpu_model,
                inventory=inventory,
                host_size_checks=False,  # a host's size is its own; each node checks it
            )
        except RenderRefused as refused:
            refusals.append((refused, inventory.hostname))
        else:
            return
    if refusals:
        first, host = refusals[0]
        raise PolicyViolation(first.field, f"{first.message} (rendered for {host})")


PROVISION_VALIDATORS = (
    validate_kernel_modules,
    validate_cpu,
    validate_kubernetes,
    validate_sharing,
    validate_mig_layout,
    validate_gpu,
    validate_as_rendered,  # last: the field checks above give the more precise errors
)
