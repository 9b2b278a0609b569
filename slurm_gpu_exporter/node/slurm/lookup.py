"""The Slurm adapter: job metadata by job id, for what the prolog could not tell.

With ``--slurm-lookup auto`` pyslurm is used when it imports and its version
matches the local Slurm (pyslurm's major.minor follows Slurm's: pyslurm 22.5.x
for Slurm 22.05, as ``scontrol --version`` prints it); otherwise, and with
``--slurm-lookup cli``, the Slurm CLI: ``scontrol -o -d show job <id>`` for jobs
the controller still knows (``squeue --json`` where a user's text makes that line
ambiguous), then ``sacct`` for finished ones. Both paths fill the
same fields; SLUIDs and jobs the controller forgot go through the CLI on both.
Results are cached for the job's life, failures are retried after a back-off, and
every call has a timeout: the adapter runs in the sampler thread, never on a scrape.
"""

from __future__ import annotations

import logging
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterable
from types import ModuleType

# The parsers live in parse.py; these names stay importable from here.
from slurm_gpu_exporter.node.slurm.parse import (
    SACCT_FIELDS,
    AmbiguousJobLine,
    SlurmJobInfo,
    gres_indices,
    parse_sacct,
    parse_scontrol_job,
    parse_squeue_json,
)
from slurm_gpu_exporter.node.source_health import SourceErrors

__all__ = [
    "SACCT_FIELDS",
    "JobLookup",
    "PySlurm",
    "SlurmCli",
    "SlurmJobInfo",
    "SlurmMetadata",
    "gres_indices",
    "make_lookup",
    "parse_sacct",
    "parse_scontrol_job",
    "parse_squeue_json",
]

log = logging.getLogger(__name__)

CLI_TIMEOUT_S = 5.0
# What sacct says on a cluster without accounting (no slurmdbd).
ACCOUNTING_DISABLED = "accounting storage is disabled"
RETRY_AFTER_S = 60.0


# --- sources ----------------------------------------------------------------

JobLookup = Callable[[str], SlurmJobInfo | None]


class SlurmCli:
    """Job look-ups through scontrol, then sacct; raises RuntimeError when both fail."""

    def __init__(self, node: str, bindir: str | None = None) -> None:
        self.node = node
        self._scontrol = shutil.which("scontrol", path=bindir)
        self._sacct = shutil.which("sacct", path=bindir)
        self._squeue = shutil.which("squeue", path=bindir)
        if not self._scontrol and not self._sacct:
            raise RuntimeError("neither scontrol nor sacct is on PATH")

    def __call__(self, jobid: str) -> SlurmJobInfo | None:
        """Look a job up by job id (or, on Slurm 26.05+, by SLUID)."""
        errors = []
        if self._scontrol:
            try:
                out = self._run([self._scontrol, "-o", "-d", "show", "job", jobid])
                for line in out.splitlines():
                    try:
                        info = parse_scontrol_job(line, self.node)
                    except AmbiguousJobLine as exc:
                        return self._from_json(jobid, str(exc))
                    if info and jobid in (info.jobid, info.sluid):
                        return info
            except RuntimeError as exc:
                errors.append(str(exc))
        if self._sacct and jobid.isdigit():
            try:
                out = self._run([self._sacct, "-X", "-n", "-P", "-j", jobid,
                                 "-o", ",".join(SACCT_FIELDS)])
                info = parse_sacct(out, jobid)
                if info:
                    return info
            except RuntimeError as exc:
                if ACCOUNTING_DISABLED not in str(exc):
                    errors.append(str(exc))
                else:
                    # A site without slurmdbd: sacct can never answer. Not a failure
                    # that should pause every look-up (scontrol still works).
                    log.info("sacct: %s; jobs the controller forgot are not looked up",
                             ACCOUNTING_DISABLED)
                    self._sacct = None
        if errors:
            raise RuntimeError("; ".join(errors))
        return None

    def _from_json(self, jobid: str, why: str) -> SlurmJobInfo | None:
        """The job from ``squeue --json``, for a line a user's text made ambiguous.

        Slurm 22.05 prints every job there (it ignores ``-j``): dear, but only for
        such jobs. Without it the job gets no metadata rather than forged metadata.
        """
        if not self._squeue:
            log.warning("job %s: scontrol's line cannot be trusted (%s) and squeue is not "
                        "on PATH for its JSON; the job gets no Slurm metadata", jobid, why)
            return None
        # --states=all: since 24.05 --json hides a job that has just ended.
        out = self._run([self._squeue, "--json", "--states=all", "-j", jobid])
        try:
            return parse_squeue_json(out, jobid, self.node)
        except ValueError:
            raise RuntimeError(f"squeue --json printed no JSON for job {jobid} (needed: "
                               f"{why}); install Slurm's serializer/json plugin") from None

    @staticmethod
    def _run(argv: list[str]) -> str:
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=CLI_TIMEOUT_S,
                                  check=False, errors="replace")
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"{argv[0]} did not answer within {CLI_TIMEOUT_S:g} s") from None
        except OSError as exc:
            raise RuntimeError(f"cannot run {argv[0]}: {exc.strerror}") from None
        if proc.returncode != 0:
            message = proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else ""
            if "Invalid job id" in message:
                return ""  # the controller forgot it; sacct may still know
            raise RuntimeError(f"{' '.join(argv[:2])} failed: {message or proc.returncode}")
        return proc.stdout


def release(version: str) -> tuple[int, int] | None:
    """(major, minor) of a Slurm or pyslurm version: ``22.05.8`` and ``22.5.1`` -> (22, 5)."""
    m = re.match(r"\s*(?:slurm\s+)?(\d+)\.(\d+)", version)
    return (int(m.group(1)), int(m.group(2))) if m else None


def pyslurm_matches(pyslurm_version: str, slurm_version: str) -> bool:
    """Whether a pyslurm build belongs to the local Slurm release (same major.minor)."""
    ours = release(pyslurm_version)
    return ours is not None and ours == release(slurm_version)


def local_slurm_version(bindir: str | None = None) -> str | None:
    """The local Slurm release as ``scontrol --version`` prints it, or None."""
    scontrol = shutil.which("scontrol", path=bindir)
    if not scontrol:
        return None
    try:
        out = SlurmCli._run([scontrol, "--version"])
    except RuntimeError:
        return None
    return out.strip() or None


def _gpu_indices_from_layout(gres: object) -> str:
    """GPU indices from one node of pyslurm's ``get_resource_layout_per_node()``.

    Its ``gres`` maps ``gpu[:type]`` to ``{"count": n, "indexes": "0,2-3"}``.
    """
    if not isinstance(gres, dict):
        return ""
    parts = []
    for name, value in gres.items():
        if str(name).split(":")[0] != "gpu" or not isinstance(value, dict):
            continue
        indexes = str(value.get("indexes") or "")
        if indexes:
            parts.append(f"gpu:1(IDX:{indexes})")
    return gres_indices(",".join(parts))


class PySlurm:
    """Job look-ups through pyslurm (the >= 22.5 object API), bounded by CLI_TIMEOUT_S.

    SLUIDs, and jobs the controller no longer knows (sacct), go through the CLI.
    """

    def __init__(self, node: str, pyslurm: ModuleType, cli: SlurmCli) -> None:
        if not hasattr(pyslurm, "Job"):
            raise RuntimeError("this pyslurm has no Job API (pyslurm >= 22.5 needed)")
        self.node = node
        self._pyslurm = pyslurm
        self._cli = cli
        self._hung: threading.Thread | None = None

    def __call__(self, jobid: str) -> SlurmJobInfo | None:
        """Look a job up by job id; a SLUID or a job the controller forgot goes to the CLI."""
        if not jobid.isdigit():
            return self._cli(jobid)
        info = self._bounded(jobid)
        return info if info is not None else self._cli(jobid)

    def _bounded(self, jobid: str) -> SlurmJobInfo | None:
        """_load in a daemon thread, waited for no longer than a CLI call.

        A libslurm call cannot be interrupted: a hung one is left behind (it cannot
        hold up the agent's exit), and no new one starts until it has returned.
        """
        if self._hung is not None and self._hung.is_alive():
            raise RuntimeError("pyslurm has not returned from an earlier call yet")
        result: dict[str, object] = {}

        def run() -> None:
            try:
                result["info"] = self._load(jobid)
            except Exception as exc:
                result["error"] = exc

        thread = threading.Thread(target=run, name="pyslurm", daemon=True)
        thread.start()
        thread.join(CLI_TIMEOUT_S)
        if thread.is_alive():
            self._hung = thread
            raise RuntimeError(f"pyslurm did not answer within {CLI_TIMEOUT_S:g} s")
        if "error" in result:
            raise RuntimeError(str(result["error"]))
        return result.get("info")  # type: ignore[return-value]

    def _load(self, jobid: str) -> SlurmJobInfo | None:
        try:
            job = self._pyslurm.Job.load(int(jobid))
        except Exception as exc:
            if "Invalid job id" in str(exc):
                return None
            raise RuntimeError(f"pyslurm: {exc}") from None
        try:
            layout = job.get_resource_layout_per_node() or {}
        except Exception:
            layout = {}
        node = layout.get(self.node) if isinstance(layout, dict) else None
        start = getattr(job, "start_time", None)
        return SlurmJobInfo(
            jobid=jobid,
            uid=getattr(job, "user_id", None),
            user=str(getattr(job, "user_name", "") or ""),
            account=str(getattr(job, "account", "") or ""),
            partition=str(getattr(job, "partition", "") or ""),
            qos=str(getattr(job, "qos", "") or ""),
            cluster=str(getattr(job, "cluster", "") or ""),
            name=str(getattr(job, "name", "") or ""),
            state=str(getattr(job, "state", "") or ""),
            array_job_id=str(getattr(job, "array_id", "") or ""),
            array_task_id=str(getattr(job, "array_task_id", "") or ""),
            job_gpus=_gpu_indices_from_layout(node.get("gres") if isinstance(node, dict) else None),
            start_time=float(start) if isinstance(start, int | float) and start > 0 else None,
        )


def _import_pyslurm() -> ModuleType:
    import pyslurm  # optional: only where it matches the local Slurm

    return pyslurm


def make_lookup(
    node: str,
    prefer_pyslurm: bool = True,
    *,
    import_pyslurm: Callable[[], ModuleType] = _import_pyslurm,
    bindir: str | None = None,
) -> JobLookup | None:
    """The job look-up for this node, or None when Slurm is not reachable.

    ``prefer_pyslurm`` (``--slurm-lookup auto``): pyslurm when it imports and its
    release is the local Slurm's; otherwise the CLI.
    """
    try:
        cli = SlurmCli(node, bindir)
    except RuntimeError as exc:
        log.warning("Slurm metadata look-ups disabled: %s. Jobs found only in cgroups "
                    "will lack account/partition; install the Slurm client commands "
                    "to fill them.", exc)
        return None
    if not prefer_pyslurm:
        return cli
    try:
        pyslurm = import_pyslurm()
    except Exception as exc:  # ImportError, or a libslurm it was not built against
        log.info("Slurm look-ups through the Slurm CLI (pyslurm not importable: %s)", exc)
        return cli
    version = str(getattr(pyslurm, "__version__", ""))
    slurm_version = local_slurm_version(bindir) or ""
    if not pyslurm_matches(version, slurm_version):
        log.warning("pyslurm %s does not match the local Slurm (%s); using the Slurm CLI "
                    "for look-ups", version or "of unknown version", slurm_version or
                    "version unknown")
        return cli
    try:
        lookup = PySlurm(node, pyslurm, cli)
    except RuntimeError as exc:
        log.warning("%s; using the Slurm CLI for look-ups", exc)
        return cli
    log.info("Slurm look-ups through pyslurm %s (Slurm %s)", version, slurm_version)
    return lookup


class SlurmMetadata:
    """Cached job look-ups: each job asked once when found, failures retried after a back-off.

    A failed look-up is counted under the ``slurm`` source of ``errors``, whoever asked
    for it: it is Slurm's problem, not the caller's. Thread-confined to the sampler.
    """

    def __init__(self, lookup: JobLookup | None, clock: Callable[[], float] = time.monotonic,
                 max_per_refresh: int = 8, *, errors: SourceErrors | None = None) -> None:
        self._lookup = lookup
        self.errors = errors
        self._clock = clock
        self._max_per_refresh = max_per_refresh
        self._known: dict[str, SlurmJobInfo] = {}
        self._retry_at: dict[str, float] = {}
        # After a failure no call is made until then: a controller that hangs costs
        # one timeout per back-off period, not one per job per sample.
        self._paused_until = 0.0

    @property
    def unreachable(self) -> bool:
        """True while look-ups are paused after a failure (or there is no way to ask)."""
        return self._lookup is None or self._clock() < self._paused_until

    def get(self, jobid: str) -> SlurmJobInfo | None:
        return self._known.get(jobid)

    def refresh(self, jobids: Iterable[str], force_state: Iterable[str] = ()) -> int:
        """Look up jobs not known yet (and re-check ``force_state`` ones); returns the errors."""
        return self.ask(jobids, force_state)[0]

    def ask(self, jobids: Iterable[str], force_state: Iterable[str] = ()
            ) -> tuple[int, dict[str, SlurmJobInfo | None]]:
        """``refresh``, returning also what this round learnt: job id -> its info, None
        where Slurm does not know it; a job not asked this round is absent.

        At most ``max_per_refresh`` calls per round so a burst of unknown jobs cannot
        stall a sample.
        """
        answers: dict[str, SlurmJobInfo | None] = {}
        if self._lookup is None:
            return 0, answers
        now = self._clock()
        if now < self._paused_until:
            return 0, answers
        forced = set(force_state)
        wanted = [j for j in jobids if j not in self._known]
        wanted += [j for j in forced if j not in wanted]
        errors = 0
        calls = 0
        for jobid in wanted:
            if self._retry_at.get(jobid, 0.0) > now or calls >= self._max_per_refresh:
                continue
            calls += 1
            try:
                info = self._lookup(jobid)
            except Exception as exc:
                errors += 1
                self._paused_until = now + RETRY_AFTER_S
                log.warning("Slurm look-up of job %s failed: %s (no look-ups for %.0f s)",
                            jobid, exc, RETRY_AFTER_S)
                if self.errors is not None:
                    self.errors.count("slurm", "a Slurm look-up failed (see the log line "
                                      "above)", log_it=False)
                break
            answers[jobid] = info
            if info is not None:
                self._known[jobid] = info
            elif jobid in forced:
                self._known.pop(jobid, None)  # Slurm forgot it: the old answer is stale
            # Unknown jobs are asked again later; so are state re-checks, never every sample.
            if info is None or jobid in forced:
                self._retry_at[jobid] = now + RETRY_AFTER_S
            else:
                self._retry_at.pop(jobid, None)
        return errors, answers

    def drop(self, jobid: str) -> None:
        """Forget one job's answer, so that the next refresh asks again (a new run)."""
        self._known.pop(jobid, None)
        self._retry_at.pop(jobid, None)

    def forget(self, keep: Iterable[str]) -> None:
        """Drop cached entries of jobs no longer tracked."""
        keep = set(keep)
        for jobid in [j for j in self._known if j not in keep]:
            del self._known[jobid]
        for jobid in [j for j in self._retry_at if j not in keep]:
            del self._retry_at[jobid]
