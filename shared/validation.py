"""Turning a msgspec validation error into a field path and a message for people."""

import re

import msgspec

# msgspec ends a message with " - at `$.a.b[0]`" or, for a bad map key, " - at `key` in `$.a`".
_AT = re.compile(r"^(?P<message>.*?) - at (`key` in )?`\$(?P<path>[^`]*)`$")
_NAMED = re.compile(r"^Object (missing required|contains unknown) field `(?P<name>[^`]+)`")


def field_of(exc: msgspec.ValidationError, *, prefix: str = "") -> tuple[str, str]:
    """The offending field as a dotted path (``quota``, ``policy.hugepages.2Mi``) and the message.

    msgspec does not name map keys (``$.quota[...]``), so a bad key or value
    of a map names the map itself.
    """
    text = str(exc)
    path = ""
    match = _AT.match(text)
    if match:
        text, path = match["message"], match["path"]
    parts = [p for p in re.split(r"\.|\[[^\]]*\]", path) if p]
    named = _NAMED.match(text)
    if named:
        parts.append(named["name"])
    if prefix:
        parts.insert(0, prefix)
    return ".".join(parts), text
