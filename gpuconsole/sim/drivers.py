"""NVIDIA driver branches the simulators play: what each exports and what its field ids mean.

The fake libnvidia-ml.so (fakenvml/fake_nvml.c) derives the same behaviour from the profile's
``driver_version`` on its own; a test holds the two to this table. Facts are read from nvml.h as
nvidia-ml-py declares it per release (12.535.161, 12.550.89, 12.560.30, 12.570.86, 12.575.51,
13.580.65, 13.580.82) and from ../shared/DOMAIN.md §7:

- ``nvmlDeviceGetTemperatureV`` exists from R560; older drivers have only
  ``nvmlDeviceGetTemperature``.
- The PCIe byte counters (fields 197/198) exist from R560 (NVML_FI_MAX is 197 in 535 and 228
  in 550, without them) and are 32-bit (valueType 1): they wrap.
- The SW-thermal, HW-thermal and HW-power-brake time counters do not exist up to 570; on 575
  and 580.65 they are fields 251-253 and the power-smoothing block starts at 256 (so 269-271
  are its active preset profile, admin override TMP floor and ramp-up rate); from 580.82 the
  power-smoothing block starts at 251 (as on 570) and the counters are 269-271.
- Fields 74 and 76 (power cap and sync boost time) are the same in every branch.
- Field 230, the GPU recovery action (nvmlDeviceGpuRecoveryAction_t), exists from R565; the
  branches before it do not know the id.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuconsole.sources.nvml.lib import driver_release

# Power-smoothing fields, as offsets into the block of eighteen that nvml.h declares.
SMOOTHING_ACTIVE_PRESET_PROFILE = 13
SMOOTHING_ADMIN_OVERRIDE_PERCENT_TMP_FLOOR = 14
SMOOTHING_ADMIN_OVERRIDE_RAMP_UP_RATE = 15
SMOOTHING_FIELDS = 18


@dataclass(frozen=True, slots=True)
class DriverProfile:
    """One driver branch as the fakes play it."""

    name: str  # "535", "580.65": what a test or `doctor` names it by
    version: str  # what nvmlSystemGetDriverVersion answers
    cuda_driver_version: int  # 12040 = CUDA 12.4
    # first field id of the SW-thermal, HW-thermal, HW-power-brake time counters; 0: none
    throttle_counters_at: int
    # first field id of the eighteen power-smoothing fields; 0: none
    smoothing_at: int

    @property
    def branch(self) -> int:
        """The major version: 535, 580."""
        return int(self.version.split(".")[0])

    @property
    def temperature_v(self) -> bool:
        """Whether the library exports nvmlDeviceGetTemperatureV."""
        return self.branch >= 560

    @property
    def pcie_byte_counters(self) -> bool:
        """Whether fields 197/198 (PCIe bytes, 32-bit) exist."""
        return self.branch >= 560

    @property
    def recovery_action(self) -> bool:
        """Whether field 230 (the driver's GPU recovery action) exists."""
        return self.branch >= 565

    def smoothing_field(self, offset: int) -> int | None:
        """The field id of one power-smoothing setting, None where the branch has none."""
        return self.smoothing_at + offset if self.smoothing_at else None


DRIVERS: tuple[DriverProfile, ...] = (
    DriverProfile("535", "535.183.01", 12020, throttle_counters_at=0, smoothing_at=0),
    DriverProfile("550", "550.90.07", 12040, throttle_counters_at=0, smoothing_at=0),
    DriverProfile("570", "570.133.20", 12080, throttle_counters_at=0, smoothing_at=251),
    DriverProfile("575", "575.57.08", 12090, throttle_counters_at=251, smoothing_at=256),
    DriverProfile("580.65", "580.65.06", 13000, throttle_counters_at=251, smoothing_at=256),
    DriverProfile("580.82", "580.82.07", 13000, throttle_counters_at=269, smoothing_at=251),
)
_BY_NAME = {d.name: d for d in DRIVERS}


def driver_profile(version: str) -> DriverProfile | None:
    """The profile that plays a driver: by its name ("580.65") or by a real version string
    ("580.76.05" plays as 580.65, "590.44.01" as 580.82): the newest profile not newer than it.
    None for a driver older than 535, or text that is no version.

    Branches between two profiles play as the older one, so 555-565 play as 550 although they
    export nvmlDeviceGetTemperatureV.
    """
    if version in _BY_NAME:
        return _BY_NAME[version]
    key = driver_release(version.strip())
    if key is None:
        return None
    fitting = [d for d in DRIVERS if (driver_release(d.version) or (0, 0)) <= key]
    return fitting[-1] if fitting else None
