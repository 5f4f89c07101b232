"""H5 on the agent's side: each physical GPU's health from NVML (reference/gpu-health.md).

The recorded sick hosts (agent/fixtures/host-fixtures.json: ``dgx-h100-sick``,
``hgx-h200-ecc``) through the fake NVML, which serves their ``health`` records as
gpu-health.md §7 says; the verdict rule of §4; the event loop of §5 (one set kept
across cycles, drained without blocking, one-shot events, sticky XID verdicts).
"""

import ctypes
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pynvml  # type: ignore[import-untyped]
import pytest
from click.testing import CliRunner

import agent.inventory
import agent.main
from agent.inventory import InventoryCollector, collect_inventory
from agent.inventory.fixture import FakeNvml
from agent.inventory.nvml.health import HEALTH_FILE, SKIP_XIDS
from agent.inventory.nvml.session import NvmlSession, collect_gpus
from agent.inventory.recording import FixtureHealth, FixtureHost, load_host
from shared.inventory import Gpu, Inventory

FIXTURES = Path(__file__).resolve().parent.parent / "agent" / "fixtures" / "host-fixtures.json"
RAW = json.loads(FIXTURES.read_text())
HOSTS = {h["id"]: h for h in RAW["hosts"]}
HEALTHY_HOSTS = [h for h in HOSTS if h not in ("dgx-h100-sick", "hgx-h200-ecc")]
BOOT = "6f1d2c1e-6b8a-4c1b-9d1e-0a1b2c3d4e5f"


def verdicts(gpus: list[Gpu]) -> list[tuple[str, list[str]]]:
    return [(g.health, g.health_reasons) for g in gpus]


def sick(host_id: str = "dgx-h100-sick") -> FixtureHost:
    return load_host(FIXTURES, host_id)


class WaitRecorder(FakeNvml):
    """The fake, recording the timeout of every event wait."""

    def __init__(self, host: FixtureHost, **kwargs: Any) -> None:
        super().__init__(host, **kwargs)
        self.timeouts: list[int] = []

    def nvmlEventSetWait_v2(self, event_set: object, timeoutms: int, /) -> Any:
        self.timeouts.append(timeoutms)
        return super().nvmlEventSetWait_v2(event_set, timeoutms)


@pytest.fixture
def session() -> Iterator[tuple[NvmlSession, WaitRecorder]]:
    fake = WaitRecorder(sick())
    with NvmlSession(fake) as held:
        yield held, fake


# --- the recorded sick hosts ----------------------------------------------------------


def test_dgx_h100_sick_verdicts() -> None:
    """H5: on dgx-h100-sick GPU 3 (XID 79) is unhealthy xid:79, GPU 5 (remap pending)
    unhealthy row_remap_pending, GPU 6 (XID 13, an application XID) healthy, the rest healthy."""
    gpus = collect_inventory(FIXTURES, "dgx-h100-sick").gpus
    assert verdicts(gpus) == [
        ("healthy", []),
        ("healthy", []),
        ("healthy", []),
        ("unhealthy", ["xid:79"]),
        ("healthy", []),
        ("unhealthy", ["row_remap_pending"]),
        ("healthy", []),
        ("healthy", []),
    ]


def test_retired_pages_not_supported_is_not_unknown() -> None:
    """H5: retired_pages_pending is null (NotSupported, as on every H100): not applicable, so
    no GPU of dgx-h100-sick is 'unknown' and no reason names it."""
    host = sick()
    assert {g.health.retired_pages_pending for g in host.gpus if g.health} == {None}
    gpus = collect_inventory(FIXTURES, "dgx-h100-sick").gpus
    assert "unknown" not in {g.health for g in gpus}
    assert not [r for g in gpus for r in g.health_reasons if "retired" in r]


def test_hgx_h200_ecc_verdicts() -> None:
    """H5: on hgx-h200-ecc GPU 0 (2 volatile uncorrected ECC errors) is unhealthy
    ecc_uncorrected_volatile:2; GPU 7 (lost) is unhealthy gpu_lost and still reported."""
    gpus = collect_inventory(FIXTURES, "hgx-h200-ecc").gpus
    assert [g.index for g in gpus] == list(range(8))
    assert verdicts(gpus) == [("unhealthy", ["ecc_uncorrected_volatile:2"])] + [
        ("healthy", [])
    ] * 6 + [("unhealthy", ["gpu_lost"])]
    assert gpus[0].ecc_uncorrected_volatile == 2


def test_a_gpu_lost_from_the_start_has_a_placeholder_identity() -> None:
    """H5: a GPU no call reaches, never seen before, keeps its index; its UUID is GPU-lost-<i>,
    with no name, family or memory (the control plane skips the family check for it)."""
    lost = collect_inventory(FIXTURES, "hgx-h200-ecc").gpus[7]
    assert (lost.index, lost.uuid, lost.name, lost.family, lost.memory_bytes) == (
        7,
        "GPU-lost-7",
        "",
        None,
        0,
    )
    assert lost.mig_instances == []


def test_a_gpu_lost_later_keeps_what_an_earlier_cycle_saw() -> None:
    """H5: a GPU that falls off the bus between cycles is reported with its UUID, name and family
    from the cycle before, unhealthy gpu_lost, its live readings dropped."""
    host = sick("dgx-h100-01")
    with NvmlSession(FakeNvml(host)) as held:
        _, before = held.collect()
        host.gpus[2].health = FixtureHealth(lost=True)
        _, after = held.collect()
    seen, lost = before[2], after[2]
    assert (lost.uuid, lost.name, lost.family, lost.memory_bytes) == (
        seen.uuid,
        seen.name,
        "H100",
        seen.memory_bytes,
    )
    assert (lost.health, lost.health_reasons, lost.temperature_c) == (
        "unhealthy",
        ["gpu_lost"],
        None,
    )
    assert verdicts(after[:2] + after[3:]) == [("healthy", [])] * 7


@pytest.mark.parametrize("host_id", HEALTHY_HOSTS)
def test_healthy_hosts_are_healthy_and_unchanged_on_the_wire(host_id: str) -> None:
    """H5: every GPU of the six healthy recordings is healthy with no reason, and the health
    fields are the only ones their JSON gains."""
    inventory = collect_inventory(FIXTURES, host_id)
    assert verdicts(inventory.gpus) == [("healthy", [])] * len(inventory.gpus)
    for gpu in msgspec.to_builtins(inventory)["gpus"]:
        assert (gpu["health"], gpu["healthReasons"]) == ("healthy", [])


def test_health_on_the_wire() -> None:
    """H5: the verdict is `health` and `healthReasons` in the inventory JSON."""
    encoded = msgspec.json.encode(collect_inventory(FIXTURES, "hgx-h200-ecc"))
    gpus = json.loads(encoded)["gpus"]
    assert (gpus[0]["health"], gpus[0]["healthReasons"]) == (
        "unhealthy",
        ["ecc_uncorrected_volatile:2"],
    )
    assert msgspec.json.decode(encoded, type=Inventory).gpus[7].health_reasons == ["gpu_lost"]


def test_inventory_command_prints_health() -> None:
    """H5, §6: `better-compute-agent inventory --fixture` (one shot) prints each GPU's verdict."""
    result = CliRunner().invoke(
        agent.main.cli,
        ["inventory", "--fixture", str(FIXTURES), "--fixture-host", "dgx-h100-sick"],
    )
    assert result.exit_code == 0, result.output
    gpus = json.loads(result.stdout)["gpus"]
    assert [g["health"] for g in gpus].count("unhealthy") == 2
    assert gpus[3]["healthReasons"] == ["xid:79"]


def test_bytes_mode_gives_the_same_verdicts() -> None:
    """H5, fake-nvml §1: with a ≤ 11.510 binding (bytes), the event's GPU is still found."""
    _, gpus = collect_gpus(FakeNvml(sick(), bytes_mode=True))
    assert verdicts(gpus) == verdicts(collect_inventory(FIXTURES, "dgx-h100-sick").gpus)


# --- the verdict rule (gpu-health.md §4) ----------------------------------------------


def test_an_unknown_error_on_a_signal_is_unknown() -> None:
    """H5: an `Unknown` error reading a signal makes the GPU 'unknown', with the signal named."""
    fake = FakeNvml(
        load_host(FIXTURES, "dgx-h100-01"),
        failures={("nvmlDeviceGetRemappedRows", 1): pynvml.NVMLError_Unknown},
    )
    _, gpus = collect_gpus(fake)
    assert (gpus[1].health, gpus[1].health_reasons) == (
        "unknown",
        ["remapped_rows:NVMLError_Unknown"],
    )
    assert {g.health for g in gpus[:1] + gpus[2:]} == {"healthy"}


def test_unhealthy_wins_over_unknown() -> None:
    """H5: an unhealthy signal and an unreadable one: unhealthy, both reasons reported."""
    fake = FakeNvml(
        sick(), failures={("nvmlDeviceGetTotalEccErrors", 5): pynvml.NVMLError_NoPermission}
    )
    _, gpus = collect_gpus(fake)
    assert (gpus[5].health, gpus[5].health_reasons) == (
        "unhealthy",
        ["row_remap_pending", "ecc_uncorrected_volatile:NVMLError_NoPermission"],
    )


@pytest.mark.parametrize(
    "error", [pynvml.NVMLError_NotSupported, pynvml.NVMLError_FunctionNotFound]
)
def test_a_signal_the_gpu_lacks_is_not_applicable(error: type[Exception]) -> None:
    """H5: NotSupported / FunctionNotFound on every signal and on event registration: healthy."""
    failures: dict[tuple[str, int | None], type[Exception]] = {
        (name, None): error
        for name in (
            "nvmlDeviceGetTotalEccErrors",
            "nvmlDeviceGetRemappedRows",
            "nvmlDeviceGetRetiredPagesPendingStatus",
            "nvmlDeviceRegisterEvents",
        )
    }
    _, gpus = collect_gpus(FakeNvml(load_host(FIXTURES, "dgx-h100-01"), failures=failures))
    assert verdicts(gpus) == [("healthy", [])] * 8


def test_reset_required_is_unhealthy() -> None:
    """H5: ResetRequired from a health call makes the GPU unhealthy reset_required."""
    fake = FakeNvml(
        load_host(FIXTURES, "dgx-h100-01"),
        failures={("nvmlDeviceGetRemappedRows", 4): pynvml.NVMLError_ResetRequired},
    )
    _, gpus = collect_gpus(fake)
    assert (gpus[4].health, gpus[4].health_reasons) == ("unhealthy", ["reset_required"])


def test_remap_failure_and_retired_pages_are_unhealthy() -> None:
    """H5: a row-remap failure and pages pending retirement each make the GPU unhealthy."""
    host = load_host(FIXTURES, "dgx-h100-01")
    host.gpus[0].health = FixtureHealth(retired_pages_pending=True)
    host.gpus[1].health = msgspec.convert(
        {"remapped_rows": {"correctable": 0, "uncorrectable": 3, "failure": True}}, FixtureHealth
    )
    _, gpus = collect_gpus(FakeNvml(host))
    assert verdicts(gpus[:2]) == [
        ("unhealthy", ["retired_pages_pending"]),
        ("unhealthy", ["row_remap_failure"]),
    ]


def test_the_skip_list_is_the_reference_one_and_configurable() -> None:
    """H5: XIDs 13, 31, 43, 45, 68 and 109 are application XIDs by default; the list is a
    setting of the session: without it XID 13 counts, with 79 added XID 79 does not."""
    assert frozenset({13, 31, 43, 45, 68, 109}) == SKIP_XIDS
    with NvmlSession(FakeNvml(sick()), skip_xids=()) as strict:
        _, gpus = strict.collect()
    assert (gpus[6].health, gpus[6].health_reasons) == ("unhealthy", ["xid:13"])
    with NvmlSession(FakeNvml(sick()), skip_xids=SKIP_XIDS | {79}) as lenient:
        _, gpus = lenient.collect()
    assert gpus[3].health == "healthy"


# --- the event loop (gpu-health.md §5) ------------------------------------------------


def test_xid_events_are_delivered_once_and_the_verdict_sticks(
    session: tuple[NvmlSession, WaitRecorder],
) -> None:
    """H5: the second cycle of one session reads no new event, yet GPU 3 is still unhealthy
    xid:79 (sticky); a fresh event set after the first is freed gets none."""
    held, fake = session
    _, first = held.collect()
    waits = fake.calls["nvmlEventSetWait_v2"]
    _, second = held.collect()
    assert fake.calls["nvmlEventSetWait_v2"] == waits + 1  # one Timeout: nothing new
    assert fake.calls["nvmlEventSetCreate"] == 1  # the same set, kept across cycles
    assert verdicts(second) == verdicts(first)
    assert (second[3].health, second[3].health_reasons) == ("unhealthy", ["xid:79"])
    held.close()
    with NvmlSession(fake) as fresh:
        _, again = fresh.collect()
    assert again[3].health == "healthy"  # the level signals still say GPU 5 is unhealthy
    assert again[5].health_reasons == ["row_remap_pending"]


def test_the_drain_never_waits(session: tuple[NvmlSession, WaitRecorder]) -> None:
    """H5: the set is drained with timeout 0 until NVMLError_Timeout: two events (XID 79 on GPU 3,
    XID 13 on GPU 6), then one Timeout, and every wait asked for 0 ms."""
    held, fake = session
    held.collect()
    assert fake.timeouts == [0, 0, 0]
    held.collect()
    assert fake.timeouts == [0, 0, 0, 0]


def test_the_drain_is_capped() -> None:
    """H5: at most drain_cap events a cycle; the rest are read the next cycle."""
    fake = FakeNvml(sick())
    with NvmlSession(fake, drain_cap=1, skip_xids=()) as held:
        _, first = held.collect()
        assert (first[3].health, first[6].health) == ("unhealthy", "healthy")
        _, second = held.collect()
        assert (second[3].health, second[6].health) == ("unhealthy", "unhealthy")


def test_nvml_is_initialised_once_and_shut_down_at_close() -> None:
    """H5: NVML stays initialised while the session holds its set; close() frees the set first,
    then shuts NVML down."""
    fake = FakeNvml(sick())
    held = NvmlSession(fake)
    held.collect()
    held.collect()
    assert (fake.calls["nvmlShutdown"], fake.calls["nvmlEventSetFree"]) == (0, 0)
    assert fake.nvmlDeviceGetCount() == 8  # still initialised between cycles
    held.close()
    assert (fake.calls["nvmlShutdown"], fake.calls["nvmlEventSetFree"]) == (1, 1)
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        fake.nvmlDeviceGetCount()
    held.close()  # twice is harmless
    assert fake.calls["nvmlShutdown"] == 1


def test_only_physical_gpus_are_registered_with_the_xid_bit() -> None:
    """H5: each physical GPU is registered once, with only the XID bit its driver supports."""
    registered: list[int] = []

    class Recorder(FakeNvml):
        def nvmlDeviceRegisterEvents(
            self, handle: object, types: int, event_set: object, /
        ) -> None:
            registered.append(types)
            super().nvmlDeviceRegisterEvents(handle, types, event_set)

    with NvmlSession(Recorder(load_host(FIXTURES, "dgx-a100-02"))) as held:
        held.collect()
        held.collect()
    assert registered == [pynvml.nvmlEventTypeXidCriticalError] * 8


def test_a_failed_registration_is_unknown_and_the_set_is_rebuilt() -> None:
    """H5, §5.1: RegisterEvents raising Unknown makes that GPU 'unknown' this cycle, and the set
    (in an undefined state) is freed and made anew the next cycle."""

    class Flaky(FakeNvml):
        broken = True

        def nvmlDeviceRegisterEvents(
            self, handle: object, types: int, event_set: object, /
        ) -> None:
            if self.broken and self.nvmlDeviceGetIndex(handle) == 2:
                raise pynvml.NVMLError_Unknown()
            super().nvmlDeviceRegisterEvents(handle, types, event_set)

    fake = Flaky(load_host(FIXTURES, "dgx-h100-01"))
    with NvmlSession(fake) as held:
        _, first = held.collect()
        assert (first[2].health, first[2].health_reasons) == (
            "unknown",
            ["xid_events:NVMLError_Unknown"],
        )
        assert fake.calls["nvmlEventSetFree"] == 1
        fake.broken = False
        _, second = held.collect()
    assert fake.calls["nvmlEventSetCreate"] == 2
    assert verdicts(second) == [("healthy", [])] * 8


def test_a_wait_that_says_gpu_lost_does_not_condemn_every_gpu() -> None:
    """H5, §5.3: GpuIsLost from the wait marks no GPU; each GPU's own reads tell."""
    fake = FakeNvml(
        load_host(FIXTURES, "dgx-h100-01"),
        failures={("nvmlEventSetWait_v2", None): pynvml.NVMLError_GpuIsLost},
    )
    _, gpus = collect_gpus(fake)
    assert verdicts(gpus) == [("healthy", [])] * 8


def test_a_wait_that_fails_otherwise_is_unknown() -> None:
    """H5: any other error from the wait makes the watched GPUs 'unknown' for the cycle."""
    fake = FakeNvml(
        load_host(FIXTURES, "dgx-h100-01"),
        failures={("nvmlEventSetWait_v2", None): pynvml.NVMLError_Unknown},
    )
    _, gpus = collect_gpus(fake)
    assert verdicts(gpus) == [("unknown", ["xid_events:NVMLError_Unknown"])] * 8


def test_no_event_support_is_unmonitored_not_unhealthy() -> None:
    """H5: a driver without event sets (NotSupported at create): XIDs unwatched, GPUs healthy,
    and the set is not asked for again."""
    fake = FakeNvml(
        load_host(FIXTURES, "dgx-h100-01"),
        failures={("nvmlEventSetCreate", None): pynvml.NVMLError_NotSupported},
    )
    with NvmlSession(fake) as held:
        held.collect()
        _, gpus = held.collect()
    assert fake.calls["nvmlEventSetCreate"] == 1
    assert verdicts(gpus) == [("healthy", [])] * 8


def test_without_a_driver_the_host_is_cpu_only() -> None:
    """H5, §6: LibraryNotFound: a CPU-only report every cycle, nothing to close."""
    fake = FakeNvml(load_host(FIXTURES, "vps-cpu-01"))
    with NvmlSession(fake) as held:
        for _ in range(2):
            info, gpus = held.collect()
            assert (info.available, info.error, gpus) == (False, "NVMLError_LibraryNotFound", [])
    assert fake.calls["nvmlShutdown"] == 0


# --- sticky across agent restarts (the state directory) -------------------------------


def boot_root(tmp_path: Path, boot: str) -> Path:
    root = tmp_path / f"root-{boot[:4]}"
    path = root / "proc/sys/kernel/random/boot_id"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(boot + "\n")
    return root


def without_events(host: FixtureHost) -> FixtureHost:
    """The host after its XIDs were read: a new NVML session sees none of them."""
    for gpu in host.gpus:
        if gpu.health is not None:
            gpu.health.xid_events = []
    return host


def test_xid_verdicts_survive_an_agent_restart_in_the_same_boot(tmp_path: Path) -> None:
    """H5: the XID verdict is kept in the state directory for this boot id, 0600: a restarted
    agent, whose new event set gets no old event, still reports GPU 3 unhealthy xid:79."""
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    with NvmlSession(FakeNvml(sick()), boot_id=BOOT, state_file=state / HEALTH_FILE) as held:
        held.collect()
    kept = json.loads((state / HEALTH_FILE).read_text())
    assert kept == {"bootId": BOOT, "xids": {sick().gpus[3].uuid: [79]}}
    assert (state / HEALTH_FILE).stat().st_mode & 0o777 == 0o600
    restarted = NvmlSession(
        FakeNvml(without_events(sick())), boot_id=BOOT, state_file=state / HEALTH_FILE
    )
    with restarted:
        _, gpus = restarted.collect()
    assert (gpus[3].health, gpus[3].health_reasons) == ("unhealthy", ["xid:79"])


def test_a_new_boot_clears_the_xid_verdicts(tmp_path: Path) -> None:
    """H5: after a reboot (another boot id) the kept XID verdicts are dropped."""
    state = tmp_path / "state"
    with NvmlSession(FakeNvml(sick()), boot_id=BOOT, state_file=state / HEALTH_FILE) as held:
        held.collect()
    rebooted = NvmlSession(
        FakeNvml(without_events(sick())), boot_id="another-boot", state_file=state / HEALTH_FILE
    )
    with rebooted:
        _, gpus = rebooted.collect()
    assert gpus[3].health == "healthy"
    assert not (state / HEALTH_FILE).exists()


def test_a_damaged_health_file_is_ignored(tmp_path: Path) -> None:
    """H5: a health file that cannot be read is logged and replaced, never fatal."""
    state = tmp_path / "state"
    state.mkdir()
    (state / HEALTH_FILE).write_text("{not json")
    with NvmlSession(FakeNvml(sick()), boot_id=BOOT, state_file=state / HEALTH_FILE) as held:
        _, gpus = held.collect()
    assert gpus[3].health_reasons == ["xid:79"]
    assert json.loads((state / HEALTH_FILE).read_text())["bootId"] == BOOT


def test_the_collector_reads_the_boot_id_under_the_sysfs_root(tmp_path: Path) -> None:
    """H5: InventoryCollector keys its health file by /proc/sys/kernel/random/boot_id."""
    state = tmp_path / "state"
    root = boot_root(tmp_path, BOOT)
    with InventoryCollector(FIXTURES, "dgx-h100-sick", root, state) as collector:
        first = collector.collect()
        second = collector()
    assert first.gpus[3].health_reasons == second.gpus[3].health_reasons == ["xid:79"]
    assert json.loads((state / HEALTH_FILE).read_text())["bootId"] == BOOT


# --- the fake (gpu-health.md §7) ------------------------------------------------------


def test_fake_events_are_real_pynvml_structs() -> None:
    """H5, §7: an event is a c_nvmlEventData_t whose device points at the GPU's one device
    struct, for the whole GPU; then NVMLError_Timeout at once."""
    fake = FakeNvml(sick())
    fake.nvmlInit()
    event_set = fake.nvmlEventSetCreate()
    assert isinstance(event_set, pynvml.c_nvmlEventSet_t)
    handle = fake.nvmlDeviceGetHandleByIndex(3)
    assert isinstance(handle, pynvml.c_nvmlDevice_t)
    assert fake.nvmlDeviceGetSupportedEventTypes(handle) == (
        pynvml.nvmlEventTypeXidCriticalError
        | pynvml.nvmlEventTypeSingleBitEccError
        | pynvml.nvmlEventTypeDoubleBitEccError
    )
    fake.nvmlDeviceRegisterEvents(handle, pynvml.nvmlEventTypeXidCriticalError, event_set)
    event = fake.nvmlEventSetWait(event_set, 5000)
    assert type(event) is pynvml.c_nvmlEventData_t
    assert (event.eventType, event.eventData) == (pynvml.nvmlEventTypeXidCriticalError, 79)
    assert (event.gpuInstanceId, event.computeInstanceId) == (0xFFFFFFFF, 0xFFFFFFFF)
    assert ctypes.addressof(event.device.contents) == ctypes.addressof(handle.contents)
    assert fake.nvmlDeviceGetUUID(event.device) == sick().gpus[3].uuid
    with pytest.raises(pynvml.NVMLError_Timeout):
        fake.nvmlEventSetWait_v2(event_set, 5000)


def test_fake_events_are_one_shot() -> None:
    """H5, §7: events left in a set are lost when it is freed; a new set never gets them."""
    fake = FakeNvml(sick())
    fake.nvmlInit()
    first = fake.nvmlEventSetCreate()
    fake.nvmlDeviceRegisterEvents(fake.nvmlDeviceGetHandleByIndex(3), 0x8, first)
    fake.nvmlEventSetFree(first)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        fake.nvmlEventSetWait_v2(first, 0)  # freed
    second = fake.nvmlEventSetCreate()
    fake.nvmlDeviceRegisterEvents(fake.nvmlDeviceGetHandleByIndex(3), 0x8, second)
    with pytest.raises(pynvml.NVMLError_Timeout):
        fake.nvmlEventSetWait_v2(second, 0)


def test_fake_refuses_unsupported_event_bits() -> None:
    """H5, §7: a mask bit outside the supported ones is NotSupported; MIG handles take no events."""
    fake = FakeNvml(load_host(FIXTURES, "ws-rtx4090"))  # ECC off: XID only
    fake.nvmlInit()
    event_set = fake.nvmlEventSetCreate()
    handle = fake.nvmlDeviceGetHandleByIndex(0)
    assert fake.nvmlDeviceGetSupportedEventTypes(handle) == pynvml.nvmlEventTypeXidCriticalError
    with pytest.raises(pynvml.NVMLError_NotSupported):
        fake.nvmlDeviceRegisterEvents(handle, pynvml.nvmlEventTypeDoubleBitEccError, event_set)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        fake.nvmlDeviceGetTotalEccErrors(handle, 1, 0)
    a100 = FakeNvml(load_host(FIXTURES, "dgx-a100-02"))
    a100.nvmlInit()
    mig = a100.nvmlDeviceGetMigDeviceHandleByIndex(a100.nvmlDeviceGetHandleByIndex(4), 0)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        a100.nvmlDeviceRegisterEvents(mig, 0x8, a100.nvmlEventSetCreate())


def test_fake_lost_gpu() -> None:
    """H5, §7: every call taking a lost GPU's handle raises GpuIsLost; GetCount still counts it
    and GetHandleByIndex still returns a handle; ByUUID and ByPciBusId raise GpuIsLost."""
    host = sick("hgx-h200-ecc")
    fake = FakeNvml(host)
    fake.nvmlInit()
    assert fake.nvmlDeviceGetCount() == 8
    handle = fake.nvmlDeviceGetHandleByIndex(7)
    for call in (
        fake.nvmlDeviceGetName,
        fake.nvmlDeviceGetUUID,
        fake.nvmlDeviceGetPciInfo,
        fake.nvmlDeviceGetMemoryInfo,
        fake.nvmlDeviceGetSupportedEventTypes,
        fake.nvmlDeviceGetRemappedRows,
    ):
        with pytest.raises(pynvml.NVMLError_GpuIsLost):
            call(handle)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        fake.nvmlDeviceRegisterEvents(handle, 0x8, fake.nvmlEventSetCreate())
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        fake.nvmlDeviceGetHandleByUUID(host.gpus[7].uuid)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        fake.nvmlDeviceGetHandleByPciBusId(host.gpus[7].pci.busId)


def test_fake_health_counters() -> None:
    """H5, §7: ECC (uncorrected: volatile and aggregate alike; corrected 0), retired pages
    (null: NotSupported) and remapped rows (a tuple of plain ints)."""
    fake = FakeNvml(sick("hgx-h200-ecc"))
    fake.nvmlInit()
    gpu0 = fake.nvmlDeviceGetHandleByIndex(0)
    assert fake.nvmlDeviceGetTotalEccErrors(gpu0, 1, pynvml.NVML_VOLATILE_ECC) == 2
    assert fake.nvmlDeviceGetTotalEccErrors(gpu0, 1, pynvml.NVML_AGGREGATE_ECC) == 2
    assert fake.nvmlDeviceGetTotalEccErrors(gpu0, 0, pynvml.NVML_VOLATILE_ECC) == 0
    with pytest.raises(pynvml.NVMLError_NotSupported):
        fake.nvmlDeviceGetRetiredPagesPendingStatus(gpu0)
    rows = FakeNvml(sick())
    rows.nvmlInit()
    assert rows.nvmlDeviceGetRemappedRows(rows.nvmlDeviceGetHandleByIndex(5)) == (1, 0, 1, 0)
    healthy = rows.nvmlDeviceGetHandleByIndex(0)  # no health record: a healthy GPU's answers
    assert rows.nvmlDeviceGetRemappedRows(healthy) == (0, 0, 0, 0)
    assert rows.nvmlDeviceGetRetiredPagesPendingStatus(healthy) == pynvml.NVML_FEATURE_DISABLED


# --- the agent's wiring ---------------------------------------------------------------


def test_run_keeps_one_collector_across_cycles(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """H5: `better-compute-agent run` takes every cycle's inventory from one collector (one
    fake NVML, one event set), so a cycle after the first still reports XID 79, read once; the
    collector is closed (set freed, NVML shut down) when the agent stops."""
    fakes: list[FakeNvml] = []
    taken: list[Inventory] = []

    class Recording(FakeNvml):
        def __init__(self, host: FixtureHost, **kwargs: Any) -> None:
            super().__init__(host, **kwargs)
            fakes.append(self)

    class TwoCycles:
        def __init__(self, settings: Any, state: Any, take: Any, *_: Any) -> None:
            self.take = take

        def run(self, stop: threading.Event, once: bool = False) -> None:
            taken.extend([self.take(), self.take()])

    monkeypatch.setattr(agent.inventory, "FakeNvml", Recording)
    monkeypatch.setattr(agent.main, "Agent", TwoCycles)
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    token = tmp_path / "join.token"
    token.write_text("bcj_x")
    result = CliRunner().invoke(
        agent.main.cli,
        [
            "run",
            "--controlplane",
            "http://127.0.0.1:9",
            "--join-token-file",
            str(token),
            "--state-dir",
            str(tmp_path / "state"),
            "--fixture",
            str(FIXTURES),
            "--fixture-host",
            "dgx-h100-sick",
            "--dry-run",
            "--log-format",
            "json",
        ],
    )
    assert result.exit_code == 0, result.output
    [fake] = fakes
    assert [inv.gpus[3].health_reasons for inv in taken] == [["xid:79"], ["xid:79"]]
    assert fake.calls["nvmlEventSetCreate"] == 1
    assert (fake.calls["nvmlEventSetFree"], fake.calls["nvmlShutdown"]) == (1, 1)
