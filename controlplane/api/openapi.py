"""The OpenAPI 3.1 document, generated from the same schemas that validate requests."""

from collections.abc import Sequence
from typing import Any

import msgspec

from controlplane.api.method import Method
from shared.schemas import ErrorBody

REF = "#/components/schemas/{name}"


def openapi_document(methods: Sequence[Method], version: str) -> dict[str, Any]:
    structs = sorted(
        {m.request for m in methods} | {m.answer for m in methods} | {ErrorBody},
        key=lambda t: t.__name__,
    )
    _, components = msgspec.json.schema_components(structs, ref_template=REF)
    error = {
        "description": "An error: code, message, details (details.field for INVALID_INPUT).",
        "content": {"application/json": {"schema": {"$ref": REF.format(name="ErrorBody")}}},
    }
    paths: dict[str, Any] = {}
    for method in methods:
        operation: dict[str, Any] = {
            "operationId": method.operation_id,
            "summary": method.summary,
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
                    "content": {
                        "application/json": {
                            "schema": {"$ref": REF.format(name=method.answer.__name__)}
                        }
                    },
                },
                "default": error,
            },
        }
        if method.auth == "none":
            operation["security"] = []  # nodes/join carries its join token in the body
        paths[method.path] = {"post": operation}
    return {
        "openapi": "3.1.0",
        "info": {"title": "Better Compute control plane", "version": version},
        "paths": paths,
        "components": {
            "schemas": components,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"bearer": []}],
    }
