"""The rig the end-to-end tests stand on: the real agent over the fake NVML (or
``--simulate``, or flags the test gives), one or more real Prometheus servers scraping it
by ``127.0.0.1:PORT``, optionally with rule files and an Alertmanager they send to,
optionally on the Slurm test cluster. It starts everything, waits until each is ready,
and stops what it started (by PID, last first) and nothing else.

    with Rig(work, cluster=slurm_cluster, scrape=Scrape(labels={"node": node})) as rig:
        rig.devices[0].processes = [Process(pid, 1 << 30)]
        rig.write_nvml()
        rig.prom.wait_for(...)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol

from tests.fakenvml import Device, FakeNvml, NvmlState, fake_nvml_or_skip
from tests.support.agent import Agent
from tests.support.daemons import Alertmanager, Prometheus, tool
from tests.support.slurmcluster import SlurmCluster


class Stoppable(Protocol):
    def stop(self) -> Any: ...


@dataclass(frozen=True)
class Scrape:
    """How one Prometheus of the rig scrapes the agent: every second, as job
    ``job_name``, the target labelled ``labels``; ``configs``, when given, makes the
    whole ``scrape_configs`` list from the agent's address instead (file SD targets,
    relabelling, a second job)."""

    job_name: str = "slurm-gpu"
    labels: Mapping[str, str] = field(default_factory=dict)
    timeout: str | None = None  # scrape_timeout
    configs: Callable[[str], list[dict[str, Any]]] | None = None

    def scrape_configs(self, address: str) -> list[dict[str, Any]]:
        if self.configs is not None:
            return self.configs(address)
        target: dict[str, Any] = {"targets": [address]}
        if self.labels:
            target["labels"] = dict(self.labels)
        job: dict[str, Any] = {"job_name": self.job_name}
        if self.timeout is not None:
            job["scrape_timeout"] = self.timeout
        return [{**job, "static_configs": [target]}]


class Rig:
    """The agent and the Prometheus servers (and Alertmanager) that watch it, ready.

    The agent runs over a fake NVML of ``devices`` GPUs (a count, or the devices; None:
    no fake NVML) with ``--spool-dir``, ``--state-dir`` (``work/state``) and
    ``--sample-interval``; on ``cluster`` its spool is the cluster's, it looks jobs up
    with ``--slurm-lookup lookup`` as the cluster's node and runs with the cluster's
    environment. ``simulate`` runs it on a simulated node instead, ``args`` with exactly
    the flags given (a test's own synthetic node); ``extra_args`` go after either.
    ``command`` runs another install than this checkout's (``cluster.site_command``);
    ``env`` is added last to the agent's environment.

    ``scrape`` (or one per name in ``scrapes``; neither: one, the default) starts a
    Prometheus each, named ``prometheus`` (or by their names); each evaluates
    ``rule_files`` every second and, with an ``alertmanager`` config, sends its alerts
    to the Alertmanager the rig starts with it.
    """

    def __init__(self, work: Path, *, cluster: SlurmCluster | None = None,
                 devices: int | Sequence[Device] | None = 4, simulate: bool = False,
                 args: Sequence[str] | None = None, extra_args: Sequence[str] = (),
                 sample_interval: float = 1.0, lookup: str = "cli",
                 spool_dir: Path | None = None, state_dir: Path | None = None,
                 command: Sequence[str] | None = None, env: Mapping[str, str] | None = None,
                 scrape: Scrape | None = None, scrapes: Mapping[str, Scrape] | None = None,
                 rule_files: Sequence[Path] = (),
                 alertmanager: dict[str, Any] | None = None) -> None:
        self.work = work
        self.cluster = cluster
        self.fake: FakeNvml | None = None
        self._nvml: NvmlState | None = None
        self.alertmanager: Alertmanager | None = None
        self.proms: dict[str, Prometheus] = {}
        self._configs: dict[str, dict[str, Any]] = {}
        self._started: list[Stoppable] = []
        work.mkdir(parents=True, exist_ok=True)
        if scrapes is None:
            scrapes = {"prometheus": scrape or Scrape()}
        if scrapes:
            tool("prometheus", package="prometheus")  # skip before anything starts
        try:
            if devices is not None and not simulate:
                self.fake = fake_nvml_or_skip(work / "nvml")
                listed = ([Device(index=i) for i in range(devices)]
                          if isinstance(devices, int) else list(devices))
                self._nvml = NvmlState(devices=listed)
                self.fake.write(self._nvml)
            if args is None:
                args = self._flags(simulate, sample_interval, lookup, spool_dir, state_dir)
            agent_env = {**(self.fake.env() if self.fake else {}),
                         **(cluster.env if cluster else {}), **(env or {})}
            self.agent = Agent([*args, *extra_args], env=agent_env,
                               log_path=work / "agent.log", command=command)
            self._started.append(self.agent)
            if alertmanager is not None:
                self.alertmanager = Alertmanager(alertmanager, work / "alertmanager")
                self._started.append(self.alertmanager)
            for name, how in scrapes.items():
                self._configs[name] = self._prometheus_config(how, rule_files)
                self._start_prometheus(name)
            self.agent.wait_ready()
            if self.alertmanager is not None:
                self.alertmanager.wait_ready()
            for prom in self.proms.values():
                prom.wait_ready()
        except BaseException:
            self.stop()
            raise

    def _flags(self, simulate: bool, sample_interval: float, lookup: str,
               spool_dir: Path | None, state_dir: Path | None) -> list[str]:
        interval = ["--sample-interval", f"{sample_interval:g}"]
        if simulate:
            return ["--simulate", *interval]
        if spool_dir is None:
            spool_dir = self.cluster.spool_dir if self.cluster else self.work / "spool"
            spool_dir.mkdir(parents=True, exist_ok=True)
        flags = ["--spool-dir", str(spool_dir),
                 "--state-dir", str(state_dir or self.work / "state"), *interval]
        if self.cluster is not None:
            flags += ["--slurm-lookup", lookup, "--node-name", self.cluster.node_name]
        return flags

    def _prometheus_config(self, scrape: Scrape, rule_files: Sequence[Path]
                           ) -> dict[str, Any]:
        config: dict[str, Any] = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"}}
        if rule_files:
            config["rule_files"] = [str(path) for path in rule_files]
        if self.alertmanager is not None:
            config["alerting"] = {"alertmanagers": [{"static_configs": [
                {"targets": [f"127.0.0.1:{self.alertmanager.port}"]}]}]}
        config["scrape_configs"] = scrape.scrape_configs(self.address)
        return config

    def _start_prometheus(self, name: str) -> Prometheus:
        prom = Prometheus(name, self._configs[name], self.work / name)
        self.proms[name] = prom
        self._started.append(prom)
        return prom

    @property
    def address(self) -> str:
        """The agent's scrape target, ``127.0.0.1:PORT``."""
        return f"127.0.0.1:{self.agent.port}"

    @property
    def prom(self) -> Prometheus:
        """The rig's Prometheus (its first, where it has several)."""
        return next(iter(self.proms.values()))

    @property
    def nvml(self) -> NvmlState:
        """What the fake NVML serves: change it (its devices, errors), then ``write_nvml``."""
        assert self._nvml is not None, "this rig has no fake NVML"
        return self._nvml

    @property
    def devices(self) -> list[Device]:
        """The fake NVML's GPUs."""
        return self.nvml.devices

    def write_nvml(self) -> None:
        """Serve the changed ``nvml`` from now on."""
        assert self.fake is not None, "this rig has no fake NVML"
        self.fake.write(self.nvml)

    def restart_prometheus(self, name: str | None = None) -> Prometheus:
        """Start a Prometheus again on its config and data (as systemd would after it
        died), ready; the one it replaces is stopped first if it still runs."""
        name = name or next(iter(self.proms))
        self.proms[name].stop()
        prom = self._start_prometheus(name)
        prom.wait_ready()
        return prom

    def stop(self) -> None:
        """Stop everything the rig started, last first (each only once it runs)."""
        while self._started:
            self._started.pop().stop()

    def __enter__(self) -> Rig:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.stop()
