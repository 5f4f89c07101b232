"""The OpenAPI 3.1 document, generated from the same schemas that validate requests."""

from collections.abc import Sequence
from typing import Any

import msgspec

from controlplane.api.method import Method
from shared.policy import Policy
from shared.schemas import ErrorBody, PoolPlan

REF = "#/components/schemas/{name}"
# The typed policy model (DESIGN §5) as JSON Schema; its parts are named PoolPolicy<Part>.
POLICY = "PoolPolicy"
POLICY_NOTE = (
    f"The pool policy. The fields the code reads are {POLICY}'s; any other field is stored and"
    " returned as given (P9), and the answer names it in `warnings`."
)
# JSON Schema counts 87.0 as an integer; the server does not (msgspec refuses a float for an
# int field), so every integer schema says so in words.
INTEGER_NOTE = "A JSON integer, written without a fraction or an exponent: 87, not 87.0 or 8.7e1."

# C1: pools/update with dryRun answers the plan instead of the pool.
OTHER_ANSWERS: dict[str, type[msgspec.Struct]] = {"/api/compute/pools/update": PoolPlan}

DESCRIPTION = (
    "Every method is a POST with `Content-Type: application/json` and a body that is a UTF-8"
    " JSON object nested at most 64 levels deep; anything else is 400 INVALID_INPUT, before"
    " authentication (R2). Integers are JSON integers: 87.0 is refused where an integer is"
    " expected. An `X-Request-Id` header matching `^[A-Za-z0-9._:-]{1,128}$` is kept, else"
    " the server makes one; every answer carries it, and error bodies as `requestId`."
)


def _note_integers(node: Any) -> None:
    """Add INTEGER_NOTE to every ``"type": "integer"`` schema under node, in place."""
    if isinstance(node, dict):
        described = node.get("description")
        if node.get("type") == "integer" and INTEGER_NOTE not in (described or ""):
            node["description"] = f"{described} {INTEGER_NOTE}" if described else INTEGER_NOTE
        for value in node.values():
            _note_integers(value)
    elif isinstance(node, list):
        for value in node:
            _note_integers(value)


def _policy_components() -> dict[str, Any]:
    """PoolPolicy and its parts; open to unknown fields at its top level, as the server is (P9)."""
    _, parts = msgspec.json.schema_components(
        [Policy], ref_template=REF.format(name=POLICY + "{name}")
    )
    named = {POLICY if n == Policy.__name__ else POLICY + n: part for n, part in parts.items()}
    named[POLICY]["additionalProperties"] = True
    return named


def openapi_document(methods: Sequence[Method], version: str) -> dict[str, Any]:
    structs = sorted(
        {m.request for m in methods}
        | {m.answer for m in methods}
        | {OTHER_ANSWERS[m.path] for m in methods if m.path in OTHER_ANSWERS}
        | {ErrorBody},
        key=lambda t: t.__name__,
    )
    _, components = msgspec.json.schema_components(structs, ref_template=REF)
    components.update(_policy_components())
    for method in methods:  # pools/create and pools/update
        properties = components[method.request.__name__].get("properties", {})
        if "policy" in properties:
            properties["policy"] = {
                "type": "object",
                "description": POLICY_NOTE,
                "allOf": [{"$ref": REF.format(name=POLICY)}],
            }
    _note_integers(components)
    error = {
        "description": "An error: code, message, details (details.field for INVALID_INPUT).",
        "content": {"application/json": {"schema": {"$ref": REF.format(name="ErrorBody")}}},
    }
    paths: dict[str, Any] = {}
    for method in methods:
        answer: dict[str, Any] = {"$ref": REF.format(name=method.answer.__name__)}
        if method.path in OTHER_ANSWERS:
            other = REF.format(name=OTHER_ANSWERS[method.path].__name__)
            answer = {"oneOf": [answer, {"$ref": other}]}
        operation: dict[str, Any] = {
            "operationId": method.operation_id,
            "summary": method.summary,
            # R1: the decision the method makes, as the README's action table shows it.
            "description": f"Authorization: {method.access.describe()}.",
            "requestBody": {
                "required": True,
                "content": {
                    "application/json": {
                        "schema": {"$ref": REF.format(name=method.request.__name__)}
                    }
                },
            },
            "responses": {
                "200": {
                    "description": "OK",
                    "content": {"application/json": {"schema": answer}},
                },
                "default": error,
            },
        }
        if method.auth == "none":
            operation["security"] = []  # nodes/join carries its join token in the body
        paths[method.path] = {"post": operation}
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Better Compute control plane",
            "version": version,
            "description": DESCRIPTION,
        },
        "paths": paths,
        "components": {
            "schemas": components,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"bearer": []}],
    }
