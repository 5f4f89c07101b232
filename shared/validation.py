"""Turning a msgspec validation error into a field path and a message for people."""

import re

import msgspec

# msgspec ends a message with " - at `$.a.b[0]`" or, for a bad map key, " - at `key` in `$.a`".
_AT = re.compile(r"^(?P<message>.*?) - at (`key` in )?`\$(?P<path>[^`]*)`$")
_NAMED = re.compile(r"^Object (missing required|contains unknown) field `(?P<name>[^`]+)`")


def whole(pattern: str) -> str:
    """A ``^…$`` pattern that matches the whole string and nothing after it.

    msgspec matches with ``re.search``, where ``$`` also matches before a final
    newline (``"acme\n"`` would pass). ``(?!\n)$`` ends at the true end, in Python
    and in the ECMA regex of JSON Schema alike.
    """
    return pattern.removesuffix("$") + r"(?!\n)$"


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
    # `$.a[1].b` → a.1.b; a map value `[...]` names its map.
    # whole() anchors every pattern with (?!\n)$; people read the pattern without it.
    text = re.sub(r"\(\?!\\+n\)", "", text)
    parts = [p for p in re.split(r"\.|\[([0-9]*)[^\]]*\]", path) if p]
    named = _NAMED.match(text)
    if named:
        parts.append(named["name"])
    if prefix:
        parts.insert(0, prefix)
    return ".".join(parts), text
