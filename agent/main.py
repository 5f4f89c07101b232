"""better-compute-agent: the per-host agent (inventory, join, report and apply arrive with issue 3)."""

import click


@click.group()
@click.version_option(package_name="better-compute")
def cli() -> None:
    """The Better Compute host agent."""
