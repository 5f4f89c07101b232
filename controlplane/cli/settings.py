"""The connection and output settings of one invocation: flags, then the environment, then a
profile in $XDG_CONFIG_HOME/better-compute/config.toml (the token read from its file, the CA
file's path made whole). The one place the CLI reads the environment."""

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import click

from controlplane.cli.exits import USAGE, fail

Output = Literal["table", "wide", "json", "yaml"]


@dataclass(frozen=True)
class Settings:
    url: str | None
    token: str | None
    ca_file: str | None  # the CA certificates an https control plane is verified against (M3)
    tenant: str | None  # the default for --tenant: BETTER_COMPUTE_TENANT, else the profile's
    output: Output


def config_path(environ: Mapping[str, str]) -> Path:
    base = environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "better-compute" / "config.toml"


def resolve(
    url: str | None,
    token: str | None,
    token_file: str | None,
    ca_file: str | None,
    profile: str | None,
    output: Output,
    environ: Mapping[str, str],
) -> Settings:
    """The one place the environment is read: flags win, then variables, then the profile."""
    # An empty variable counts as unset, as `VAR= better-compute …` means to a shell user.
    url = url or environ.get("BETTER_COMPUTE_URL") or None
    token = token or environ.get("BETTER_COMPUTE_TOKEN") or None
    token_file = token_file or environ.get("BETTER_COMPUTE_TOKEN_FILE") or None
    ca_file = ca_file or environ.get("BETTER_COMPUTE_CA_FILE") or None
    profile = profile or environ.get("BETTER_COMPUTE_PROFILE") or None
    values: dict[str, Any] = {}
    path = config_path(environ)
    if profile is not None or path.exists():
        try:
            profiles = tomllib.loads(path.read_text()).get("profiles", {})
        except (OSError, tomllib.TOMLDecodeError) as exc:
            fail(f"cannot read {path}: {exc}", USAGE)
        # Without --profile, a profile named "default" applies when there is one.
        name = profile or "default"
        if name not in profiles and profile is not None:
            fail(f"no profile {name!r} in {path}", USAGE)
        values = profiles.get(name, {})
        for key in ("url", "token", "token_file", "ca_file", "tenant"):
            if key in values and not isinstance(values[key], str):
                fail(f"profile {name!r} in {path}: {key} must be a string", USAGE)
    url = url or values.get("url")
    ca_file = ca_file or values.get("ca_file")
    if token is None and token_file is None and "token" not in values:
        token_file = values.get("token_file")
    token = token or values.get("token")
    if token is None and token_file is not None:
        try:
            token = Path(token_file).expanduser().read_text().strip()
        except OSError as exc:
            fail(f"cannot read the token file: {exc}", USAGE)
    if ca_file is not None:
        ca_file = str(Path(ca_file).expanduser())
    tenant = environ.get("BETTER_COMPUTE_TENANT") or values.get("tenant")
    return Settings(url, token, ca_file, tenant, output)


def settings() -> Settings:
    """The connection and output settings of this invocation (the root group's `resolve`)."""
    found: Settings = click.get_current_context().find_object(Settings)  # type: ignore[assignment]
    return found
