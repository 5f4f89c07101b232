"""better-compute: the operator and tenant CLI (its verbs arrive with the CLI issue)."""

import click


@click.group()
@click.version_option(package_name="better-compute")
def cli() -> None:
    """Drive a Better Compute control plane over its HTTP API."""
