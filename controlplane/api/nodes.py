"""Node methods: join tokens, join, report, spec, list, get."""

from typing import Any

from controlplane.api.method import Method, write
from controlplane.runtime import Runtime
from controlplane.services import nodes
from shared import schemas as s


def _list(runtime: Runtime, principal: Any, body: Any) -> Any:
    with runtime.db.snapshot() as db:
        return nodes.list_nodes(db, principal, runtime.liveness, body)


def _get(runtime: Runtime, principal: Any, body: Any) -> Any:
    with runtime.db.snapshot() as db:
        return nodes.get_node(db, principal, runtime.liveness, body)


def _spec(runtime: Runtime, node: Any, body: Any) -> Any:
    with runtime.db.snapshot() as db:
        return nodes.node_spec(db, node, body)


METHODS = (
    Method(
        "/api/compute/joinTokens/create",
        s.JoinTokensCreate,
        s.JoinTokenCreated,
        write(nodes.create_join_token),
        "A pool-scoped, expiring, limited-use join token (owner only); shown once.",
    ),
    Method(
        "/api/compute/nodes/join",
        s.NodesJoin,
        s.NodeJoined,
        lambda runtime, _, body: nodes.join_node(runtime.db, body),
        "Join a pool with an attestor (join-token: the token in the body); answers the node credential once.",
        auth="none",
    ),
    Method(
        "/api/compute/nodes/report",
        s.NodesReport,
        s.Reported,
        lambda runtime, node, body: nodes.report_node(runtime.db, runtime.liveness, node, body),
        "A node reports its inventory (node credential); an unchanged one writes nothing.",
        auth="node",
    ),
    Method(
        "/api/compute/nodes/spec",
        s.NodesSpec,
        s.NodeSpec,
        _spec,
        "The node's desired state (node credential).",
        auth="node",
    ),
    Method(
        "/api/compute/nodes/list",
        s.NodesList,
        s.NodeList,
        _list,
        "A pool's nodes with their resource rows and GPU atoms (owner only).",
    ),
    Method(
        "/api/compute/nodes/get",
        s.NodesGet,
        s.NodeView,
        _get,
        "One node with its resource rows and GPU atoms (owner only).",
    ),
)
