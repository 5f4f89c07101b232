"""better-compute: the operator and tenant CLI over the HTTP API (DESIGN §7), one command per
HTTP API method.

`group` is the root group; `settings` the connection and output settings (flags, environment,
profile); `calls` the API calls and their exit statuses (`exits`); `output` the tables and -o;
`params` the shared options and parameter types; `ids` whole ids from their ends. One module
per command family registers its commands on the group when imported.
"""

from controlplane.cli import hosts, iam, nodes, pools
from controlplane.cli.group import cli

__all__ = ["cli", "hosts", "iam", "nodes", "pools"]
