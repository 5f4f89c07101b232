"""The root group `better-compute`: its options (the connection, -o), its help's epilog, and
the output options accepted anywhere on the line. Each command family's module registers its
commands on `cli` when imported."""

import os
from typing import get_args

import click

from controlplane.cli.settings import Output, resolve

EPILOG = """\b
Connection: --url/BETTER_COMPUTE_URL, and --token-file/BETTER_COMPUTE_TOKEN_FILE or
--token/BETTER_COMPUTE_TOKEN, and --ca-file/BETTER_COMPUTE_CA_FILE for a control plane
whose certificate a private CA signed; or --profile NAME from
~/.config/better-compute/config.toml ([profiles.NAME] url, token_file, ca_file, tenant).
--tenant defaults to BETTER_COMPUTE_TENANT, then to the profile's tenant.

\b
Ids: a command takes an id whole, or the end of one the caller sees (as a table shows
it, …x7k2m9qa, the … optional) when no other visible id of its kind ends so.

\b
Exit status: 0 done; 1 refused by the control plane (its error code on stderr);
2 a usage error; 3 the control plane could not be reached (connection refused,
a TLS failure, a timeout, a 5xx answer).

\b
Shell completion (bash, zsh, fish):
  eval "$(_BETTER_COMPUTE_COMPLETE=bash_source better-compute)"
"""


class AnywhereOutput(click.Group):
    """The output options where people put them: `better-compute pools list --tenant acme -o
    wide` (or `--json`) works like `better-compute -o wide pools list --tenant acme`."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if "--" in args:
            return super().parse_args(ctx, args)
        front: list[str] = []
        rest: list[str] = []
        index = 0
        while index < len(args):
            arg = args[index]
            if arg in ("-o", "--output") and index + 1 < len(args):
                front += args[index : index + 2]
                index += 2
                continue
            glued = arg.startswith("--output=") or (arg.startswith("-o") and len(arg) > 2)
            (front if arg == "--json" or glued else rest).append(arg)
            index += 1
        return super().parse_args(ctx, [*front, *rest])


@click.group(
    cls=AnywhereOutput, epilog=EPILOG, context_settings={"help_option_names": ["-h", "--help"]}
)
@click.version_option(package_name="better-compute")
@click.option("--url", help="control plane URL [BETTER_COMPUTE_URL]")
@click.option("--token", help="API token [BETTER_COMPUTE_TOKEN]")
@click.option("--token-file", help="file holding the API token [BETTER_COMPUTE_TOKEN_FILE]")
@click.option(
    "--ca-file",
    help="CA certificates (PEM) to verify an https control plane by [BETTER_COMPUTE_CA_FILE]",
)
@click.option("--profile", help="profile in config.toml [BETTER_COMPUTE_PROFILE]")
@click.option(
    "-o",
    "--output",
    type=click.Choice(get_args(Output)),
    help="table (the default: fits 100 columns), wide (ids whole, nothing cut), json or yaml",
)
@click.option("--json", "as_json", is_flag=True, help="the same as -o json")
@click.pass_context
def cli(
    ctx: click.Context,
    url: str | None,
    token: str | None,
    token_file: str | None,
    ca_file: str | None,
    profile: str | None,
    output: Output | None,
    as_json: bool,
) -> None:
    """Drive a Better Compute control plane over its HTTP API."""
    if as_json and output not in (None, "json"):
        raise click.UsageError(f"--json is -o json: it cannot go with -o {output}")
    chosen: Output = "json" if as_json else (output or "table")
    ctx.obj = resolve(url, token, token_file, ca_file, profile, chosen, os.environ)
