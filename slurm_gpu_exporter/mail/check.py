"""``slurm-gpu-mail --check [--config PATH]``: the config checked at install time, so a
typo fails the deploy instead of the next job's mail. One line per problem, naming the
key; exit 0 when there is none."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from slurm_gpu_exporter.mail.config import (
    CONFIG_ENV,
    DEFAULT_CONFIG,
    ConfigProblem,
    LoadedConfig,
    MailConfig,
    config_path,
    load_mail_config,
)

EXIT_PROBLEMS = 1


def is_check(args: list[str]) -> bool:
    """Whether the command line asks for a check (Slurm always passes -s SUBJECT USER)."""
    return bool(args) and (args[0] in ("--check", "--config")
                           or args[0].startswith("--config="))


def _program(key: str, path: str) -> ConfigProblem | None:
    if not os.path.exists(path):
        return ConfigProblem(key, f"{path} does not exist")
    if not os.path.isfile(path):
        return ConfigProblem(key, f"{path} is no file")
    if not os.access(path, os.X_OK):
        return ConfigProblem(key, f"{path} is not executable")
    return None


def problems_of(loaded: LoadedConfig) -> list[ConfigProblem]:
    """What the file says wrong, then what its settings point at that is not there."""
    config: MailConfig = loaded.config
    found = list(loaded.problems)
    for key, program in (("mailer", config.mailer), ("report", config.report)):
        problem = _program(key, program)
        if problem is not None:
            found.append(problem)
    if config.log_file is not None and not config.log_file.parent.is_dir():
        found.append(ConfigProblem("log_file", f"{config.log_file.parent} is no directory"))
    return found


def check_main(args: list[str]) -> int:
    """The ``--check`` command; its exit status."""
    parser = argparse.ArgumentParser(
        prog="slurm-gpu-mail --check",
        description="Check slurm-gpu-mail's config: one line per problem, exit 1 if any.")
    parser.add_argument("--check", action="store_true", required=True)
    parser.add_argument("--config", type=Path, default=None,
                        help=f"the file to check (default ${CONFIG_ENV} or {DEFAULT_CONFIG})")
    options = parser.parse_args(args)
    path = options.config or config_path()
    loaded = load_mail_config(path)
    problems = problems_of(loaded)
    if not loaded.found and options.config is not None:
        problems.insert(0, ConfigProblem("", "does not exist"))
    for problem in problems:
        print(problem.line(path), file=sys.stderr)
    if problems:
        return EXIT_PROBLEMS
    state = "ok" if loaded.found else "no file: every setting at its default, ok"
    print(f"{path}: {state} (mailer {loaded.config.mailer})")
    return 0
