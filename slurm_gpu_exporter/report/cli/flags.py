"""``slurm-gpu-report``'s subcommands and their flags, and the Prometheus client the
Prometheus flags describe."""

from __future__ import annotations

import argparse
import functools
import logging
import os

from slurm_gpu_exporter.model.munge_wire import payload as munge_payload
from slurm_gpu_exporter.report.cli.client_config import (
    AUTH_METHODS,
    CLIENT_ENV,
    DEFAULT_CLIENT_CONFIG,
    load_client_config,
)
from slurm_gpu_exporter.report.cli.remediate import add_remediate_command
from slurm_gpu_exporter.report.errors import ReportError
from slurm_gpu_exporter.report.prometheus.client import Connection, PrometheusClient, read_secret
from slurm_gpu_exporter.report.prometheus.retry import (
    DEFAULT_MAX_CONCURRENT,
    DEFAULT_RETRIES,
    RetryPolicy,
)
from slurm_gpu_exporter.report.slurm.munge import munge_credential
from slurm_gpu_exporter.report.top.wait import WAIT_S

log = logging.getLogger("slurm_gpu_exporter.report")

FORMATS = ("table", "csv", "json", "markdown", "html")
DEFAULT_URL = "http://localhost:9090"
DEFAULT_STATE = "/var/lib/slurm-gpu-report/notified.json"
DEFAULT_SMTP = "smtp://localhost:25"
DEFAULT_ENFORCE_STATE = "/var/lib/slurm-gpu-report/enforce.json"
# Here, not in the archive package: building the parser loads no database library.
DEFAULT_DB = "sqlite:////var/lib/slurm-gpu-report/archive.sqlite"


def _prometheus_options(parser: argparse.ArgumentParser) -> None:
    conn = parser.add_argument_group("Prometheus")
    conn.add_argument("--prometheus-url",
                      help="base URL of the Prometheus API or of slurm-gpu-proxy (env "
                           "SLURM_GPU_REPORT_PROMETHEUS_URL; then the client config "
                           f"{DEFAULT_CLIENT_CONFIG}, env {CLIENT_ENV}; default {DEFAULT_URL})")
    conn.add_argument("--auth", choices=AUTH_METHODS,
                      help="munge: sign in to slurm-gpu-proxy --munge as yourself with a "
                           "munge credential (default from the client config, else none)")
    conn.add_argument("--timeout", type=float, help="seconds per query (default 30)")
    conn.add_argument("--max-concurrent-queries", type=_positive, metavar="N",
                      default=DEFAULT_MAX_CONCURRENT,
                      help="queries in flight at once (default "
                           f"{DEFAULT_MAX_CONCURRENT}); keep it under the store's own "
                           "limit (VictoriaMetrics: -search.maxConcurrentRequests)")
    conn.add_argument("--retries", type=_count, metavar="N", default=DEFAULT_RETRIES,
                      help="times a query is tried again when the server answers 503 or "
                           f"429 (busy), after its Retry-After (default {DEFAULT_RETRIES})")
    conn.add_argument("--username", help="basic auth user")
    conn.add_argument("--password-file", help="basic auth password, first line of this file")
    conn.add_argument("--bearer-token-file", help="bearer token, first line of this file")
    conn.add_argument("--ca-file", help="CA bundle to verify Prometheus' TLS certificate")
    conn.add_argument("--cert-file", help="client certificate (TLS)")
    conn.add_argument("--key-file", help="client certificate key (TLS)")
    conn.add_argument("--insecure-skip-verify", action="store_true",
                      help="do not verify Prometheus' TLS certificate")


def _positive(text: str) -> int:
    value = _count(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be 1 or more")
    return value


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError("must be 0 or more")
    return value


def _db(parser: argparse.ArgumentParser, default: str | None) -> None:
    store = parser.add_argument_group("job archive")
    env = os.environ.get("SLURM_GPU_REPORT_DB")
    if default is None:
        store.add_argument("--db", metavar="URL",
                           help="also read the job archive: sqlite:///PATH or postgresql://…")
    else:
        store.add_argument("--db", metavar="URL", default=env or default,
                           help="the job archive: sqlite:///PATH or postgresql://… (env "
                                f"SLURM_GPU_REPORT_DB; default {default})")
    store.add_argument("--db-timeout", type=float, default=10.0, metavar="SECONDS",
                       help="how long to wait for the archive (connection, locks)")


def _window_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--since", help="window length up to --end (e.g. 7d, 36h)")
    parser.add_argument("--start", help="window start (ISO 8601 or Unix time)")
    parser.add_argument("--end", help="window end (ISO 8601, Unix time or 'now')")


def _output_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--format", choices=FORMATS, default="table")
    parser.add_argument("--output", "-o", help="write the report to this file, not stdout")


def _cluster_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cluster", help="only series whose cluster label has this value")
    parser.add_argument("--cluster-label", default="cluster",
                        help="the label the scrape config puts the cluster name in")


def _mail_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--mail-to", default="{user}",
                        help="recipient template, e.g. '{user}@example.org' (default '{user}')")
    parser.add_argument("--mail-from", default="slurm-gpu-report", help="sender address")


def _review_options(parser: argparse.ArgumentParser) -> None:
    review = parser.add_argument_group(
        "the admins' review", "mail the report (HTML with its charts, and plain text) and/or "
                              "write it as a dated file; nothing goes to stdout")
    review.add_argument("--report-to", metavar="ADDR[,ADDR…]",
                        help="mail the report to these addresses (--mail-to is the users' "
                             "notices, not this)")
    review.add_argument("--smtp", metavar="URL",
                        help=f"the mail server for --report-to: smtp://host[:port] (default "
                             f"{DEFAULT_SMTP})")
    review.add_argument("--out-dir", metavar="DIR",
                        help="also write the report there as low-util-[CLUSTER-]YYYY-MM-DD."
                             "html (mode 0640), even when the mail fails")


def _smtp_login_options(parser: argparse.ArgumentParser) -> None:
    relay = parser.add_argument_group(
        "the mail server's login", "for --report-to's mail and --notify smtp://: STARTTLS "
                                   "and SMTP AUTH, as a site's relay asks; each flag wins "
                                   "over its smtp_* key in the [notify] section of "
                                   "--config (enforce: --policy)")
    relay.add_argument("--smtp-starttls", action="store_true",
                       help="require STARTTLS and verify the server's certificate (system "
                            "CAs, or --smtp-ca-file); no mail without it")
    relay.add_argument("--smtp-ca-file", metavar="FILE",
                       help="CA bundle to verify the mail server's certificate")
    relay.add_argument("--smtp-user", metavar="NAME",
                       help="SMTP AUTH user (needs --smtp-starttls and --smtp-password-file)")
    relay.add_argument("--smtp-password-file", metavar="FILE",
                       help="SMTP AUTH password: this file's text, less one trailing "
                            "newline")


def _common(parser: argparse.ArgumentParser, outputs: bool = True) -> None:
    _prometheus_options(parser)
    if outputs:
        _output_options(parser)
    parser.add_argument("--config", help="TOML file with thresholds, notes and templates")
    _cluster_options(parser)
    _window_options(parser)
    parser.add_argument("--verbose", "-v", action="store_true",
                        help="log each query and the query count on stderr")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="slurm-gpu-report",
        description="GPU efficiency reports of Slurm jobs from the metrics of "
                    "slurm-gpu-exporter in Prometheus.")
    sub = parser.add_subparsers(dest="command", required=True)
    job = sub.add_parser("job", help="one or more jobs: usage per node and GPU, and notes")
    job.add_argument("jobids", nargs="+", metavar="JOBID")
    job.add_argument("--no-sacct", action="store_true",
                     help="do not ask Slurm accounting for time limit and memory request")
    _common(job)
    _db(job, None)
    low = sub.add_parser("low-util", help="jobs under a GPU busy threshold in a window")
    low.add_argument("--threshold", type=float,
                     help="busy ratio under which a job is flagged (0..1; default from config)")
    low.add_argument("--user")
    low.add_argument("--account")
    low.add_argument("--partition")
    low.add_argument("--min-gpu-hours", type=float,
                     help="flag only jobs that held at least this many GPU-hours")
    low.add_argument("--notify", metavar="TARGET",
                     help="tell each flagged user: smtp://host[:port] or a webhook URL")
    low.add_argument("--dry-run", action="store_true", help="print what --notify would send")
    _mail_options(low)
    low.add_argument("--state-file", default=DEFAULT_STATE,
                     help=f"when each job was reported (default {DEFAULT_STATE})")
    _review_options(low)
    _smtp_login_options(low)
    _common(low)
    _db(low, None)
    arch = sub.add_parser("archive", help="store a summary of the jobs that ended in a window "
                                          "in the job archive (default --since 2h)")
    arch.add_argument("--no-sacct", action="store_true",
                      help="do not ask Slurm accounting for state, exit code and limits")
    _common(arch, outputs=False)
    _db(arch, DEFAULT_DB)
    use = sub.add_parser("usage", help="GPU-hours held, busy and wasted per account, user, "
                                       "partition or cluster, from the job archive")
    use.add_argument("--by", nargs="+", required=True, metavar="KEY",
                     help="one or more of account, user, partition, cluster")
    use.add_argument("--month", metavar="YYYY-MM", help="the jobs that ended in this month")
    use.add_argument("--cluster", help="only jobs of this cluster")
    use.add_argument("--config", help="TOML file of the report; its [energy] factor adds "
                                      "emissions")
    _window_options(use)
    _output_options(use)
    _db(use, DEFAULT_DB)
    top = sub.add_parser("top", help="one running job, live: per node and GPU now and over "
                                     "the job, until it ends")
    top.add_argument("jobid", metavar="JOBID")
    top.add_argument("--interval", type=float, default=5.0, metavar="SECONDS",
                     help="seconds between frames (default 5; the store's scrape interval "
                          "is the finest that changes anything)")
    top.add_argument("--once", action="store_true", help="print one frame and exit")
    top.add_argument("--wait", type=float, default=WAIT_S, metavar="SECONDS",
                     help="a job Slurm lists as running or pending that Prometheus has no "
                          "sample of yet: seconds after its start (pending: from now) to "
                          f"wait for its first (default {WAIT_S:g}; 0: do not wait)")
    _prometheus_options(top)
    top.add_argument("--config", help="TOML file with thresholds and notes")
    _cluster_options(top)
    top.add_argument("--verbose", "-v", action="store_true",
                     help="log each query on stderr")
    sub.add_parser("default-config", help="print the default configuration (TOML)")
    _add_mlflow_command(sub)
    _add_enforce_commands(sub)
    return parser


def _add_mlflow_command(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """``mlflow``: the ended jobs' figures into the MLflow runs that name them."""
    mlflow = sub.add_parser(
        "mlflow", help="write the figures of the jobs that ended in a window into the MLflow "
                       "runs tagged with them (default --since 2h; once per run)")
    mlflow.add_argument("--tracking-uri", metavar="URL",
                        default=os.environ.get("MLFLOW_TRACKING_URI"),
                        help="the MLflow tracking server (env MLFLOW_TRACKING_URI; "
                             "credentials from MLFLOW_TRACKING_TOKEN or "
                             "MLFLOW_TRACKING_USERNAME/PASSWORD)")
    mlflow.add_argument("--mlflow-timeout", type=float, default=30.0, metavar="SECONDS",
                        help="seconds per request to the tracking server (default 30)")
    mlflow.add_argument("--no-sacct", action="store_true",
                        help="do not ask Slurm accounting for the jobs' state")
    mlflow.add_argument("--dry-run", action="store_true",
                        help="say what would be written, write nothing")
    mlflow.add_argument("--pending-expiry", default="7d", metavar="DURATION",
                        help="a pending run that no ended job of its own can fill this "
                             "long after it started is marked expired (default 7d)")
    _common(mlflow, outputs=False)


def _add_enforce_commands(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """``enforce``, ``default-policy`` and ``remediate``."""
    enforce = sub.add_parser(
        "enforce", help="warn, then cancel, jobs whose GPUs are idle (dry run by default)")
    enforce.add_argument("--policy", required=True, metavar="FILE",
                         help="the policy (TOML; see default-policy)")
    enforce.add_argument("--cancel", action="store_true",
                         help="act: send the warnings and cancel (without it: a dry run)")
    enforce.add_argument("--format", choices=("table", "json"), default="table")
    enforce.add_argument("--notify", metavar="TARGET",
                         help="warn users through smtp://host[:port] or a webhook URL")
    _mail_options(enforce)
    _smtp_login_options(enforce)
    enforce.add_argument("--state-file", default=DEFAULT_ENFORCE_STATE,
                         help=f"warnings sent and cancels (default {DEFAULT_ENFORCE_STATE})")
    _cluster_options(enforce)
    enforce.add_argument("--node-label", metavar="LABEL",
                         help="the label naming each GPU's Slurm node, where the scrape "
                              "config sets one (a port is dropped); default: the node its "
                              "agent names in slurm_gpu_exporter_node_info, else the "
                              "target's host; checked against squeue's node list")
    enforce.add_argument("--verbose", "-v", action="store_true",
                         help="log each query on stderr")
    _prometheus_options(enforce)
    sub.add_parser("default-policy", help="print the default enforce policy (TOML)")
    _prometheus_options(add_remediate_command(sub))


def connection(args: argparse.Namespace) -> Connection:
    """The flags, then the environment, then the client config, then the defaults."""
    site = load_client_config()
    url = (args.prometheus_url or os.environ.get("SLURM_GPU_REPORT_PROMETHEUS_URL")
           or site.prometheus_url or DEFAULT_URL)
    auth = args.auth or site.auth or "none"
    return Connection(
        url=url, timeout_s=args.timeout or site.timeout_s or 30.0, username=args.username,
        password=read_secret(args.password_file),
        bearer_token=read_secret(args.bearer_token_file), ca_file=args.ca_file or site.ca_file,
        cert_file=args.cert_file, key_file=args.key_file,
        insecure_skip_verify=args.insecure_skip_verify,
        munge_credential=functools.partial(munge_credential, _munge_payload(url),
                                           site.munge_socket,
                                           restrict_uid=site.munge_restrict_uid)
        if auth == "munge" else None,
        max_concurrent=args.max_concurrent_queries,
        retry=RetryPolicy(retries=args.retries))


def _munge_payload(url: str) -> str:
    """What names the proxy at ``url`` in each munge credential (model/munge_wire.py)."""
    try:
        return munge_payload(url)
    except ValueError as exc:
        raise ReportError(f"bad --prometheus-url {url!r}: {exc}") from None


def munge_auth(args: argparse.Namespace) -> bool:
    """True when the report signs in with munge (flag or client config)."""
    return (args.auth or load_client_config().auth) == "munge"


def _log_query(query: str) -> None:
    log.debug("query: %s", query)


def prometheus(args: argparse.Namespace) -> PrometheusClient:
    """The client the Prometheus flags describe; each query is logged with --verbose."""
    return PrometheusClient(connection(args), on_query=_log_query)
