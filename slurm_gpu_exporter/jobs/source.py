"""What a source of the sample is: the one protocol the sampler runs every source by.

A source (the job tracker, the cgroup statistics, the GPUs, RAPL, the node's power meter,
the training relay) takes its part of a sample from a ``SampleContext`` that holds what
the sources before it produced, by name; it names the snapshot fields its part fills,
saves and restores its own state, and says whether it worked. The sampler
(sampling/sampler.py) knows no source by name: it runs the list the agent built
(agent/sources.py), in order, times each, and turns a crash into an error counted under
the source's own health name.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from slurm_gpu_exporter.jobs.job import Job


@dataclass
class SampleContext:
    """One sample as the sources see it: its time and the parts taken so far, by source name."""

    now: float
    parts: dict[str, Any] = field(default_factory=dict)

    @property
    def tracked(self) -> list[Job] | None:
        """The tracker's jobs, running and lingering; None when it failed in this sample
        (then nothing may be forgotten for want of a job)."""
        jobs: list[Job] | None = self.parts.get("registry")
        return jobs

    @property
    def jobs(self) -> list[Job]:
        return self.tracked or []


@runtime_checkable
class SampleSource(Protocol):
    """A source of the sample. ``name`` is its step (timed in
    ``slurm_gpu_exporter_sample_step_duration_seconds``, its part's key in the context);
    ``health_names`` the names in node/source_health.SOURCES it answers for (up or down in
    ``slurm_gpu_exporter_source_up``; a crash of ``take`` counts under the first);
    ``state_key`` where its state lives in the state file (None: it keeps none)."""

    name: str
    health_names: tuple[str, ...]
    state_key: str | None

    def take(self, ctx: SampleContext) -> Any:
        """This sample's part."""

    def failed_part(self) -> Any:
        """The part when ``take`` raised."""

    def up(self, part: Any) -> bool:
        """Whether the part is good, beyond the source having counted no error."""

    def snapshot_fields(self, part: Any) -> dict[str, Any]:
        """The snapshot fields (exposition/snapshot.Snapshot) the part fills."""

    def export_state(self) -> dict[str, Any]: ...
    def import_state(self, data: dict[str, Any]) -> None: ...
    def close(self) -> None: ...


class SourceDefaults:
    """What most sources do: no state, a good part whenever nothing was counted, no
    fields, nothing to close. A source overrides what it has."""

    state_key: str | None = None

    def failed_part(self) -> Any:
        return None

    def up(self, part: Any) -> bool:
        return True

    def snapshot_fields(self, part: Any) -> dict[str, Any]:
        return {}

    def export_state(self) -> dict[str, Any]:
        return {}

    def import_state(self, data: dict[str, Any]) -> None:
        pass

    def close(self) -> None:
        pass


@runtime_checkable
class ReadsBetweenSamples(Protocol):
    """A source that must also read between samples (the GPUs' sample buffers, which
    overrun unseen at long intervals). ``lazy_state``: the key of its state that may be
    written late, and how late (seconds), or None."""

    def between_samples(self) -> float | None:
        """Seconds between reads; None: no read needed now."""

    def read_between(self) -> None: ...

    def lazy_state(self) -> tuple[str, float] | None: ...

