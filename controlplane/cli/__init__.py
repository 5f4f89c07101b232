"""better-compute: the operator and tenant CLI over the HTTP API (DESIGN §7).

`core` holds the connection settings, the shared client calls, output and the root group;
one module per command family registers its commands on that group when imported.
"""

from controlplane.cli import hosts, iam, nodes, pools
from controlplane.cli.core import cli

__all__ = ["cli", "hosts", "iam", "nodes", "pools"]
