"""Attribution of one GPU's reading: busy time, energy, memory, processes and GPM activity
to the jobs that use or hold it (whole GPUs, MIG instances, lost GPUs), the rest to the
users outside every job. The parts it adds to and the hand-out to jobs are
gpu/attribution/ledger.py's; the per-job counters live in gpu/attribution/counters.py."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

from slurm_gpu_exporter.exposition.snapshot import UnattributedSample
from slurm_gpu_exporter.gpu.attribution.counters import JobGpuCounters
from slurm_gpu_exporter.gpu.attribution.energy import EnergyDelta
from slurm_gpu_exporter.gpu.attribution.job_errors import HealthDelta
from slurm_gpu_exporter.gpu.attribution.ledger import GpuLedger, Poll, Share
from slurm_gpu_exporter.gpu.attribution.samples import mig_sample
from slurm_gpu_exporter.gpu.attribution.shares import (
    GpuTarget,
    energy_shares,
    mig_sm_fraction,
    shares,
)
from slurm_gpu_exporter.gpu.attribution.usage import Usage
from slurm_gpu_exporter.gpu.driver.clocks import wall_to_driver_us
from slurm_gpu_exporter.gpu.driver.integration import since_start
from slurm_gpu_exporter.gpu.readings import DeviceReading, HostClocks
from slurm_gpu_exporter.jobs.job import Job

_NO_SHARE = Share(0.0, None, None)  # MIG: NVML measures no per-instance busy time


def _to_users(target: GpuTarget, usage: Usage, poll: Poll,
              user_busy: Mapping[str, float] | None = None) -> None:
    """Use outside every job, by user (with its busy time where the target has one)."""
    for user, (n, mem) in sorted(usage.unattributed.items()):
        poll.unattributed.append(UnattributedSample(
            target.gpu, target.uuid, user, n, mem, (user_busy or {}).get(user)))


def is_idle(reading: DeviceReading, holders: list[str], process_samples: object) -> bool:
    """No job holds the GPU and no process uses it (nor has samples on it)."""
    return not (reading.mig or holders or reading.processes or process_samples)


def _idle_gpu(a: GpuAttributor, reading: DeviceReading) -> None:
    """A GPU no job holds and no process uses: its own totals only. What the full path
    would give its jobs and users is nothing, so none of that work is done (an idle
    node's sample: the device series alone)."""
    a.energy.hold(reading.uuid, False)
    a.health.hold(reading.uuid, False)
    a.activity.add(reading.uuid, reading.gpm)
    a.idle_polls += 1


class GpuAttributor(GpuLedger):
    """The per-GPU half of the GPU sampler: what each reading adds to which job, through
    the parts and the hand-out to jobs of gpu/attribution/ledger.py."""

    idle_check = staticmethod(is_idle)  # tests replace it: the full path for every GPU

    def attribute_gpu(self, reading: DeviceReading, poll: Poll) -> None:
        """A whole GPU: busy time, energy, memory and processes to the jobs using or
        holding it; the rest to the users outside every job."""
        parent = GpuTarget(str(reading.index), reading.uuid, reading.minor)
        at = reading.clocks or HostClocks(realtime=poll.now)
        figures = self.devices.integrate(reading, at)
        window, busy = figures.window, figures.busy
        energy = self.energy.delta(reading, poll.now)
        health = self.health.interval(reading, poll.now)
        holders = [] if reading.mig else self.users.holders(parent, poll.running)
        if self.idle_check(reading, holders, figures.process_samples):
            _idle_gpu(self, reading)
            poll.devices.append(self.device_sample(
                reading, busy, (busy / window) if busy is not None and window else None))
            return
        usage = self.users.usage(reading.processes, figures.process_samples,
                                 poll.key_to_job, poll.seen_pids)
        if reading.mig:
            self._attribute_mig(reading, poll, energy, health)
            # The parent keeps its device series (power, energy, temperature, ECC, Xid);
            # its processes are the instances' and are counted there.
            poll.devices.append(self.device_sample(
                reading, busy, (busy / window) if busy is not None and window else None))
            return
        trim = figures.clock if window and figures.before is not None else None
        busy_shares = shares(usage.weight, holders) if busy else {}
        self.energy.hold(parent.uuid, bool(holders))
        # The first reading after a restart covers the time the agent was down: only the
        # jobs that held the GPU across it take part.
        across = None if energy.gap_from is None else self.counters.held_across(
            [poll.key_to_job[j] for j in holders], parent.uuid, energy.gap_from)
        e_shares = energy_shares(busy_shares, busy or 0.0, holders, only=across)
        self.health.hold(parent.uuid, bool(holders))
        h_across = self._held_across(holders, parent.uuid, health, poll)

        def figures_of(key: str, job: Job, c: JobGpuCounters) -> Share:
            job_window, job_busy, unknown = window or 0.0, busy, figures.unknown
            if c.fresh and figures.before is None:
                # The part since its start, and no more busy time than it holds (the first
                # samples of a GPU that was idle can reach back before the job).
                job_window = max(0.0, min(job_window, poll.now - (job.start_time or poll.now)))
                job_busy = None if job_busy is None else min(job_busy, job_window)
            elif trim and c.fresh and job.start_time and figures.samples:
                # Only a job's first window can reach back before its start.
                start_us = wall_to_driver_us(job.start_time, trim, at)
                if start_us is not None:
                    job_window, job_busy, unknown = since_start(figures, start_us)
            elif c.fresh:
                unknown = min(unknown, max(0.0, poll.now - (job.start_time or poll.now)))
            if window and (figures.before is not None or job_window):
                c.fresh = False
            return Share(
                job_window,
                None if job_busy is None else job_busy * busy_shares.get(key, 0.0),
                None if energy.joules is None else energy.joules * e_shares.get(key, 0.0),
                unknown)

        jobids = self._to_jobs(parent, usage, holders, poll, figures_of)
        self._give_health(parent, jobids, health, h_across, poll)
        self._count_activity(parent, reading.gpm, jobids, bool(usage.unattributed), poll)
        user_busy = self.counters.count_unattributed_busy(parent.uuid, usage, busy, busy_shares)
        _to_users(parent, usage, poll, user_busy)
        poll.devices.append(self.device_sample(
            reading, busy, (busy / window) if busy is not None and window else None,
            usage.unattributed))

    def hold_lost(self, reading: DeviceReading, poll: Poll) -> None:
        """A lost GPU is still allocated to its jobs: their allocated time goes on, their
        busy time cannot (nothing measures it), which is what a broken GPU costs them."""
        if not reading.uuid:
            return  # lost before it could be identified: nothing to match jobs against
        target = GpuTarget(str(reading.index), reading.uuid, reading.minor)
        holders = set(self.users.holders(target, poll.running))
        for job in poll.running:
            if job.jobid in holders:
                c = self._counter(job, target)
                poll.touched.add((job.jobid, target.uuid))
                self.hold(c, job, poll.now, 0.0)
                c.utilization, c.memory, c.processes = None, 0, 0

    def _attribute_mig(self, reading: DeviceReading, poll: Poll, energy: EnergyDelta,
                       health: HealthDelta) -> None:
        """MIG instances: allocation by MIG UUID, processes by GPU and compute instance id;
        NVML gives no per-instance utilization, so busy time is not attributed. The GPU's
        energy goes to each instance by its share of the SMs (its compute slices), evenly
        among the jobs holding it. GPM measures a whole GPU instance: where it has several
        compute instances, their jobs get none of it (it would count once per compute
        instance)."""
        per_gi = Counter(inst.gpu_instance_id for inst in reading.mig)
        held_any = False
        for inst in reading.mig:
            target = GpuTarget(f"{reading.index}.{inst.gpu_instance_id}", inst.uuid,
                               None, is_mig=True, parent_uuid=reading.uuid)
            procs = tuple(p for p in reading.processes
                          if p.gpu_instance_id == inst.gpu_instance_id
                          and p.compute_instance_id in (None, inst.compute_instance_id))
            usage = self.users.usage(procs, (), poll.key_to_job, poll.seen_pids)
            holders = self.users.holders(target, poll.running)
            held_any = held_any or bool(holders)
            fraction = mig_sm_fraction(inst.name, reading.name)
            joules = (None if energy.joules is None or fraction is None
                      else energy.joules * fraction)
            across = None if energy.gap_from is None else self.counters.held_across(
                [poll.key_to_job[j] for j in holders], target.uuid, energy.gap_from)
            e_shares = energy_shares({}, 0.0, holders, only=across)
            h_across = self._held_across(holders, target.uuid, health, poll)

            def figures_of(key: str, job: Job, c: JobGpuCounters,
                           joules: float | None = joules,
                           e_shares: dict[str, float] = e_shares) -> Share:
                if joules is None:
                    return _NO_SHARE
                return Share(0.0, None, joules * e_shares.get(key, 0.0))

            jobids = self._to_jobs(target, usage, holders, poll, figures_of)
            self._give_health(target, jobids, health, h_across, poll)
            alone = per_gi[inst.gpu_instance_id] == 1
            self._count_activity(target, inst.gpm, jobids if alone else set(),
                                 bool(usage.unattributed), poll)
            _to_users(target, usage, poll)
            poll.devices.append(mig_sample(reading.uuid, target.gpu, inst, usage.unattributed,
                                           self.activity))
        self.energy.hold(reading.uuid, held_any)
        self.health.hold(reading.uuid, held_any)
