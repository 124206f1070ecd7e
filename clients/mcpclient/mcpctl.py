"""``mcpctl``: the operator CLI (click + rich). This module is its entry point: the command group with its
global options, and the one place where what a command raised becomes a message and an exit code.

Exit codes:

    0  success
    1  the cluster refused or failed it (an MCPError other than the next: NOT_FOUND, FAILED_PRECONDITION,
       INVALID_ARGUMENT from a service...), or a local step failed (a file, a key, py-spy)
    2  bad usage or invalid input (click's usage errors, a bad --shape or --input), found before sending
    3  a service could not be reached: UNAVAILABLE or DEADLINE_EXCEEDED talking to it (worth retrying)
    4  load: the wanted replicas were not RUNNING within --timeout (the load goes on in the background)
  130  interrupted (Ctrl-C), except for status --watch, which ends that way (0)

Every error is exactly one line on stderr, ``mcpctl <command>: <message>``, never a traceback (an
unexpected exception too; ``MCPCTL_DEBUG=1`` re-raises it). Commands live in ``cluster_cmds`` (status, list,
load, unload, pause, resume, traffic, breaker, drain, undrain), ``request_cmds`` (route, infer),
``debug_cmds`` (dump, profile) and ``model_cmds`` (encrypt-model, keygen); ``ctlkit`` is what they share.
``main(argv) -> int`` is the console script (``mcpctl = "mcpclient.mcpctl:main"``).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence

import click

from mcpclient import cluster_cmds, debug_cmds, model_cmds, request_cmds
from mcpclient.config import client_environment
from mcpclient.ctlkit import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    Ctl,
    Failure,
    address_options,
    apply_security,
    exit_code,
    security_options,
)
from mcpcore.errors import MCPError

__all__ = ["cli", "main"]


def _exit_codes() -> str:
    """``mcpctl --help``'s epilog: the exit codes as the module docstring lists them (one list, not two);
    ``\\b`` keeps click from rewrapping it."""
    _, found, rest = (__doc__ or "").partition("Exit codes:\n\n")
    return "\b\nExit codes:\n" + rest.split("\n\n", 1)[0] if found else ""


@click.group(
    name="mcpctl",
    epilog=_exit_codes(),
    no_args_is_help=True,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110},
)
@click.version_option(package_name="mcpmesh", prog_name="mcpctl", message="%(prog)s %(version)s")
@address_options
@security_options
@click.option(
    "-o",
    "--output",
    type=click.Choice(["table", "json"]),
    default="table",
    show_default=True,
    help="table for people, or json: one document on stdout",
)
@click.pass_obj
def cli(
    ctl: Ctl, *, scheduler: str, router: str, health: str, etcd: str, output: str, **security: str
) -> None:
    """Operate an mcpmesh cluster: models, traffic, breakers, workers, requests, and a look inside."""
    ctl.scheduler, ctl.router, ctl.health, ctl.etcd, ctl.output = scheduler, router, health, etcd, output
    apply_security(ctl, security)
    click.get_current_context().call_on_close(ctl.close)


for _command in (
    *cluster_cmds.COMMANDS,
    *request_cmds.COMMANDS,
    *debug_cmds.COMMANDS,
    *model_cmds.COMMANDS,
):
    cli.add_command(_command)


def _say(where: str, message: str) -> None:
    text = " ".join(message.split())  # one line, whatever the message held
    sys.stderr.write(f"{where}: {text}\n")


def _usage(err: click.UsageError) -> int:
    ctx = err.ctx
    if isinstance(err, click.exceptions.NoArgsIsHelpError) and ctx is not None:
        sys.stderr.write(ctx.get_help() + "\n")  # `mcpctl` or `mcpctl breaker` alone: the help
        return EXIT_USAGE
    where = ctx.command_path if ctx is not None else "mcpctl"
    message = err.format_message().rstrip(".")
    if message[:1].isupper() and message[1:2].islower():  # click's "Missing option": one line, lower case
        message = message[:1].lower() + message[1:]
    _say(where, f"{message} (see '{where} -h')")
    return EXIT_USAGE


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``mcpctl`` with ``argv`` (default: the process's arguments) and return its exit code."""
    logging.basicConfig(level=logging.WARNING, format="mcpctl: %(levelname)s: %(message)s")
    ctl = Ctl()  # the group's options fill it in; each command records its name in it
    try:
        result = cli.main(
            args=list(sys.argv[1:] if argv is None else argv),
            prog_name="mcpctl",
            standalone_mode=False,
            obj=ctl,
        )
    except click.UsageError as err:
        return _usage(err)
    except click.ClickException as err:
        _say(ctl.command, err.format_message())
        return err.exit_code
    except Failure as err:
        _say(ctl.command, err.message)
        return err.code
    except MCPError as err:
        _say(ctl.command, err.message)
        return exit_code(err)
    except OSError as err:
        where = f": {err.filename}" if err.filename else ""
        _say(ctl.command, f"{err.strerror or err}{where}")
        return EXIT_FAILED
    except click.Abort:  # Ctrl-C (click turns KeyboardInterrupt into Abort)
        _say(ctl.command, "interrupted")
        return EXIT_INTERRUPTED
    except Exception as err:
        if client_environment().ctl_debug:
            raise
        _say(ctl.command, f"internal error: {type(err).__name__}: {err} (MCPCTL_DEBUG=1 shows the traceback)")
        return EXIT_FAILED
    return result if isinstance(result, int) else EXIT_OK  # an int: --help or --version's exit code


if __name__ == "__main__":
    sys.exit(main())
