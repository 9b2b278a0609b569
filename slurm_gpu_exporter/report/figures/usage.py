"""What ``usage`` is made of: sums over the archived jobs of a group (and month).

The sums are the roll-up's columns (``archive/rollup.py``): the summed job figures of
``figures/table.py`` and the jobs' derived sums, by column name.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from slurm_gpu_exporter.report.figures.window import Window


@dataclass
class UsageGroup:
    """``usage``: sums over the archived jobs of one group (and month, for the trend)."""

    key: tuple[str, ...]  # the values of the --by keys, in their order
    month: str = ""  # YYYY-MM for the trend rows; "" for the window's totals
    jobs: int = 0
    allocated_s: float = 0.0
    busy_s: float = 0.0
    sm_active_s: float = 0.0
    gpm_allocated_s: float = 0.0
    energy_j: float = 0.0
    cpu_s: float = 0.0
    tensor_active_s: float = 0.0
    dram_active_s: float = 0.0
    cpu_energy_j: float = 0.0  # the jobs' CPU and DRAM shares (RAPL)
    emissions_g: float = 0.0  # as archived: GPU + CPU energy at the factor of the time

    more: dict[str, float] = field(default_factory=dict)  # summed figures without a field

    SUMMED = ("allocated_s", "busy_s", "sm_active_s", "gpm_allocated_s", "energy_j", "cpu_s",
              "tensor_active_s", "dram_active_s", "cpu_energy_j", "emissions_g")

    def sums(self) -> dict[str, float]:
        return {**{name: getattr(self, name) for name in self.SUMMED}, **self.more}

    def add(self, sums: dict[str, float]) -> None:
        """Add another group's (or a query row's) sums, by name."""
        for name, value in sums.items():
            if name in self.SUMMED:
                setattr(self, name, getattr(self, name) + value)
            else:
                self.more[name] = self.more.get(name, 0.0) + value

    def sum_of(self, column: str) -> float:
        """The sum of a job figure's archive column (``tensor_active_s``)."""
        return getattr(self, column) if column in self.SUMMED else self.more.get(column, 0.0)

    def gpu_hours_of(self, column: str) -> float:
        """A summed figure in seconds (``tensor_active_s``) as GPU-hours."""
        return self.sum_of(column) / 3600

    @property
    def tensor_active_gpu_hours(self) -> float:
        return self.gpu_hours_of("tensor_active_s")

    @property
    def dram_active_gpu_hours(self) -> float:
        return self.gpu_hours_of("dram_active_s")

    @property
    def cpu_energy_kwh(self) -> float:
        return self.cpu_energy_j / 3.6e6

    @property
    def gpu_hours(self) -> float:
        return self.allocated_s / 3600

    @property
    def busy_gpu_hours(self) -> float:
        return self.busy_s / 3600

    @property
    def sm_active_gpu_hours(self) -> float:
        return self.sm_active_s / 3600

    @property
    def wasted_gpu_hours(self) -> float:
        return max(0.0, self.allocated_s - self.busy_s) / 3600

    @property
    def busy_ratio(self) -> float | None:
        return min(1.0, self.busy_s / self.allocated_s) if self.allocated_s > 0 else None

    @property
    def energy_kwh(self) -> float:
        return self.energy_j / 3.6e6

    @property
    def cpu_hours(self) -> float:
        return self.cpu_s / 3600


@dataclass
class UsageReport:
    """``usage``: per-group sums over a window from the archive, and by month when the
    window spans several."""

    window: Window
    by: tuple[str, ...]
    groups: list[UsageGroup]
    months: list[UsageGroup] = field(default_factory=list)  # key () per month, in order
    source: str = ""  # the archive, without its password
    gco2e_per_kwh: float | None = None  # the configured emissions factor, if any
    emissions_archived: bool = False  # some job in it was archived with its emissions
