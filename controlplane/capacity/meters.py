"""GPU-hour meters: which meter a pool's GPUs count on, and what a booking counts (pure)."""


def meter_of(gpu_model: str | None) -> str | None:
    return f"gpu.{gpu_model.lower()}.hours" if gpu_model else None


def gpu_equivalents(resource: str, amount: int, profile: str | None, replicas: int) -> float:
    """A whole GPU counts 1; a MIG instance its share of the 7 compute slices; a slot 1/replicas."""
    if resource == "gpu":
        return float(amount)
    if resource == "gpu.mig" and profile:
        slices = int(profile.split("g.", 1)[0].split(".")[-1])
        return amount * slices / 7
    if resource == "gpu.slot":
        return amount / max(1, replicas)
    return 0.0
