"""The CLI's exit statuses, as `better-compute --help` gives them, and the one way to stop
with one: a line on stderr, never a traceback."""

from typing import NoReturn

import click

REFUSED, USAGE, UNREACHABLE = 1, 2, 3  # refused by the control plane; a usage error; not reached


def fail(message: str, code: int) -> NoReturn:
    click.echo(f"error: {message}", err=True)
    raise click.exceptions.Exit(code)
