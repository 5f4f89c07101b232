"""GPU families from NVML names (N1): every name of the reference tables, and its traps.

The pairs are copied by hand from the team reference (nvml-names.md §1 and §5);
the project never reads the handbook at test time.
"""

import pytest

from shared.gpu import family_of

# nvml-names.md §1: every nvmlDeviceGetName() string, alternatives included.
TABLE_1 = [
    ("NVIDIA A100-SXM4-40GB", "A100"),
    ("A100-SXM4-40GB", "A100"),  # older drivers: no prefix
    ("NVIDIA A100-PCIE-40GB", "A100"),
    ("NVIDIA A100-SXM4-80GB", "A100"),
    ("NVIDIA A100 80GB PCIe", "A100"),
    ("NVIDIA A100-SXM-64GB", "A100"),
    ("NVIDIA A800-SXM4-80GB", "A800"),
    ("NVIDIA A800 80GB PCIe", "A800"),
    ("NVIDIA A800-SXM4-40GB", "A800"),
    ("NVIDIA A800 40GB Active", "A800"),
    ("NVIDIA A30", "A30"),
    ("NVIDIA A40", "A40"),
    ("NVIDIA A10", "A10"),
    ("NVIDIA A10G", "A10G"),
    ("Tesla T4", "T4"),
    ("Tesla V100-SXM2-16GB", "V100"),
    ("Tesla V100-SXM2-32GB", "V100"),
    ("Tesla V100-PCIE-16GB", "V100"),
    ("Tesla V100-PCIE-32GB", "V100"),
    ("Tesla V100S-PCIE-32GB", "V100S"),
    ("NVIDIA H100 80GB HBM3", "H100"),
    ("NVIDIA H100 PCIe", "H100"),
    ("NVIDIA H100 NVL", "H100"),
    ("NVIDIA H100", "H100"),
    ("NVIDIA H800", "H800"),
    ("NVIDIA H800 PCIe", "H800"),
    ("NVIDIA H800 NVL", "H800"),
    ("NVIDIA H200", "H200"),
    ("NVIDIA H200 NVL", "H200"),
    ("NVIDIA H20", "H20"),
    ("NVIDIA H20-3e", "H20"),
    ("NVIDIA H20 NVL16", "H20"),
    ("NVIDIA GH200 480GB", "GH200"),
    ("NVIDIA GH200 120GB", "GH200"),
    ("NVIDIA GH200 144G HBM3e", "GH200"),
    ("NVIDIA B200", "B200"),
    ("NVIDIA GB200", "GB200"),
    ("NVIDIA B100", "B100"),
    ("NVIDIA B300 SXM6 AC", "B300"),
    ("NVIDIA GB300", "GB300"),
    ("NVIDIA L40S", "L40S"),
    ("NVIDIA L40", "L40"),
    ("NVIDIA L4", "L4"),
    ("NVIDIA L20", "L20"),
    ("NVIDIA GeForce RTX 4090", "RTX-4090"),
    ("NVIDIA GeForce RTX 4090 D", "RTX-4090-D"),
    ("NVIDIA RTX 6000 Ada Generation", "RTX-6000-ADA"),
    ("NVIDIA RTX A6000", "RTX-A6000"),
    ("Quadro RTX 6000", "QUADRO-RTX-6000"),
    ("NVIDIA RTX PRO 6000 Blackwell Server Edition", "RTX-PRO-6000-BLACKWELL"),
    ("NVIDIA RTX PRO 6000 Blackwell Workstation Edition", "RTX-PRO-6000-BLACKWELL"),
    ("NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition", "RTX-PRO-6000-BLACKWELL"),
    ("NVIDIA DGX Display", None),
    ("DGX Display", None),
]

# nvml-names.md §5: the rule's examples and its table.
TABLE_5 = [
    ("H100 80GB HBM3", "H100"),
    ("H100 NVL", "H100"),
    ("A100 80GB PCIe", "A100"),
    ("A100-SXM4-80GB", "A100"),
    ("GH200 480GB", "GH200"),
    ("H20-3e", "H20"),
    ("V100-SXM2-16GB", "V100"),
    ("V100S-PCIE-32GB", "V100S"),
    ("B300 SXM6 AC", "B300"),
    ("H100-SXM5-80GB", "H100"),  # the user form: not an NVML string, accepted anyway
    ("NVIDIA A100-SXM4-80GB MIG 1g.10gb", "A100"),
    ("NVIDIA vGPU-48GB", "VGPU"),
]

# nvml-names.md §1: each row's pciDeviceId (alternatives included) and its family.
PCI_IDS = [
    (0x20B010DE, "A100"),
    (0x20F110DE, "A100"),
    (0x20B110DE, "A100"),
    (0x20B210DE, "A100"),
    (0x20B510DE, "A100"),
    (0x20B310DE, "A100"),
    (0x20F310DE, "A800"),
    (0x20F510DE, "A800"),
    (0x20BD10DE, "A800"),
    (0x20F610DE, "A800"),
    (0x20B710DE, "A30"),
    (0x223510DE, "A40"),
    (0x223610DE, "A10"),
    (0x223710DE, "A10G"),
    (0x1EB810DE, "T4"),
    (0x1DB110DE, "V100"),
    (0x1DB510DE, "V100"),
    (0x233010DE, "H100"),
    (0x233110DE, "H100"),
    (0x232110DE, "H100"),
    (0x233910DE, "H100"),
    (0x233D10DE, "H100"),
    (0x232410DE, "H800"),
    (0x232210DE, "H800"),
    (0x233A10DE, "H800"),
    (0x233510DE, "H200"),
    (0x233B10DE, "H200"),
    (0x232910DE, "H20"),
    (0x232C10DE, "H20"),
    (0x230E10DE, "H20"),
    (0x234210DE, "GH200"),
    (0x234810DE, "GH200"),
    (0x290110DE, "B200"),
    (0x290910DE, "B200"),
    (0x294110DE, "GB200"),
    (0x318210DE, "B300"),
    (0x31C210DE, "GB300"),
    (0x31C310DE, "GB300"),
    (0x26B910DE, "L40S"),
    (0x26B510DE, "L40"),
    (0x27B810DE, "L4"),
    (0x26BA10DE, "L20"),
    (0x268410DE, "RTX-4090"),
    (0x268510DE, "RTX-4090-D"),
    (0x26B110DE, "RTX-6000-ADA"),
    (0x223010DE, "RTX-A6000"),
    (0x2BB510DE, "RTX-PRO-6000-BLACKWELL"),
    (0x2BB110DE, "RTX-PRO-6000-BLACKWELL"),
    (0x2BB410DE, "RTX-PRO-6000-BLACKWELL"),
    (0x1FB010DE, None),
]

LOOKALIKES = [
    ("NVIDIA H20", "NVIDIA H200"),  # H20-3e is an H20 (table above)
    ("NVIDIA L4", "NVIDIA L40", "NVIDIA L40S"),
    ("NVIDIA A10", "NVIDIA A100-SXM4-80GB", "NVIDIA A10G"),
    ("NVIDIA B200", "NVIDIA GB200"),
    ("NVIDIA H100", "NVIDIA GH200 480GB", "NVIDIA H800"),
    (
        "NVIDIA RTX 6000 Ada Generation",
        "NVIDIA RTX A6000",
        "Quadro RTX 6000",
        "NVIDIA RTX PRO 6000 Blackwell Server Edition",
    ),
]


@pytest.mark.parametrize(("name", "family"), TABLE_1)
def test_reference_table_names(name: str, family: str | None) -> None:
    """N1: every NVML name of the reference table maps to the table's family."""
    assert family_of(name) == family


@pytest.mark.parametrize(("name", "family"), TABLE_5)
def test_rule_examples(name: str, family: str | None) -> None:
    """N1: the rule's own examples (bare, user-typed, MIG handle, vGPU) give its families."""
    assert family_of(name) == family


@pytest.mark.parametrize(("pci_device_id", "family"), PCI_IDS)
def test_engineering_name_falls_back_to_pci_id(pci_device_id: int, family: str | None) -> None:
    """N1 step 6: an engineering board name is classified by its PCI device id."""
    assert family_of("NVIDIA PG506-232", pci_device_id) == family


@pytest.mark.parametrize("group", LOOKALIKES)
def test_lookalikes_stay_apart(group: tuple[str, ...]) -> None:
    """N1: names that share a prefix never share a family (H20 is not H200)."""
    families = [family_of(name) for name in group]
    assert len(set(families)) == len(families), families


@pytest.mark.parametrize(("name", "family"), TABLE_1)
def test_mig_handle_names_take_the_parents_family(name: str, family: str | None) -> None:
    """N1 step 1: "<parent> MIG <profile>" is the parent's family."""
    assert family_of(f"{name} MIG 1g.10gb") == family


def test_whitespace_and_case_are_normalized() -> None:
    """N1 step 1/3: stray whitespace and brand-word case do not change the family."""
    assert family_of("  nvidia   H100   80GB  HBM3 ") == "H100"
    assert family_of("NVIDIA\tGeForce  RTX 4090") == "RTX-4090"


def test_brand_words_are_stripped_repeatedly() -> None:
    """N1 step 3: NVIDIA, Tesla and GeForce go in any sequence; Quadro stays."""
    assert family_of("NVIDIA Tesla V100-SXM2-16GB") == "V100"
    assert family_of("NVIDIA Quadro RTX 6000") == "QUADRO-RTX-6000"


def test_other_user_forms() -> None:
    """N1: the go-nvml mock and document spellings of a model give its family."""
    assert family_of("H100_SXM5_80GB") == "H100"
    assert family_of("H200-SXM5") == "H200"
    assert family_of("B200_SXM5_180GB") == "B200"


def test_name_wins_over_pci_id() -> None:
    """N1 step 6: the PCI table decides only when the name gives no known family."""
    assert family_of("NVIDIA H20", 0x233510DE) == "H20"
    assert family_of("NVIDIA A100-PG509-200", 0x233010DE) == "A100"


def test_pci_fallback_forms() -> None:
    """N1 step 6: a bare device id works; another vendor's id or an unknown one does not."""
    assert family_of("NVIDIA PG506-232", 0x20B0) == "A100"
    assert family_of("NVIDIA PG506-232", 0x20B01002) == "PG506"
    assert family_of("NVIDIA PG509-210", 0xFFFF10DE) == "PG509"
    assert family_of("NVIDIA PG509-210") == "PG509"


def test_display_gpu_is_never_a_pool_member() -> None:
    """N1 step 2: the DGX Station display GPU has no family, whatever its id."""
    assert family_of("NVIDIA DGX Display", 0x20B010DE) is None
    assert family_of("", 0x1FB010DE) is None


def test_empty_name_without_id_has_no_family() -> None:
    """N1: nothing to derive from gives None, not an empty family."""
    assert family_of("") is None
    assert family_of("NVIDIA") is None


def test_vgpu_is_never_the_physical_model() -> None:
    """N1: a vGPU guest is VGPU, even with the physical board's PCI id."""
    assert family_of("NVIDIA vGPU-48GB", 0x223010DE) == "VGPU"
    assert family_of("GRID T4-16Q") == "VGPU"
    assert family_of("NVIDIA A40-48Q") == "VGPU"
    assert family_of("NVIDIA A100-4C") == "VGPU"


def test_workstation_tails_are_dropped() -> None:
    """N1 step 4: TITAN/GTX lines keep every word; marketing tails go."""
    assert family_of("NVIDIA TITAN RTX") == "TITAN-RTX"
    assert family_of("NVIDIA GeForce GTX 1080 Ti") == "GTX-1080-TI"
    assert family_of("NVIDIA RTX PRO 6000 Blackwell Server Edition MIG 1g.24gb") == (
        "RTX-PRO-6000-BLACKWELL"
    )
