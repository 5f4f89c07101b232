"""Node methods: join tokens, join, report, spec, list, get."""

from controlplane.api.method import Method, Read, Write, write
from controlplane.services import joining, node_ops, nodes, reports
from controlplane.services.access import Access
from shared import schemas as s

METHODS = (
    Method(
        "/api/compute/joinTokens/create",
        s.JoinTokensCreate,
        s.JoinTokenCreated,
        write(joining.create_join_token),
        "A pool-scoped, expiring, limited-use join token (owner only); shown once.",
        Access("compute:nodes:join", "owned-pool"),
    ),
    Method(
        "/api/compute/nodes/join",
        s.NodesJoin,
        s.NodeJoined,
        Write(lambda store, _rt, _caller, body: joining.join_node(store, body)),
        "Join a pool with an attestor (join-token: the token in the body); answers the node credential once.",
        Access("compute:nodes:join", "attestor"),
    ),
    Method(
        "/api/compute/nodes/report",
        s.NodesReport,
        s.Reported,
        Write(lambda store, rt, node, body: reports.report_node(store, rt.liveness, node, body)),
        "A node reports its inventory (node credential); an unchanged one writes nothing.",
        Access("compute:nodes:report", "own-node"),
    ),
    Method(
        "/api/compute/nodes/spec",
        s.NodesSpec,
        s.NodeSpec,
        Read(lambda db, node, body, _: reports.node_spec(db, node, body)),
        "The node's desired state (node credential).",
        Access("compute:nodes:spec", "own-node"),
    ),
    Method(
        "/api/compute/nodes/list",
        s.NodesList,
        s.NodeList,
        Read(
            lambda db, principal, body, rt: nodes.list_nodes(db, principal, rt.liveness, body),
            offload=True,
        ),
        "A pool's nodes, or without poolId the fleet's (every pool the tenant owns), by id, a "
        "page at a time (owner only; B1: limit, default 100, and cursor; next is null at the end).",
        Access("compute:nodes:read", "owned-pools"),
    ),
    Method(
        "/api/compute/nodes/get",
        s.NodesGet,
        s.NodeView,
        Read(lambda db, principal, body, rt: nodes.get_node(db, principal, rt.liveness, body)),
        "One node with its resource rows and GPU atoms (owner only).",
        Access("compute:nodes:read", "node"),
    ),
    Method(
        "/api/compute/nodes/cordon",
        s.NodesCordon,
        s.NodeView,
        Write(lambda store, rt, who, body: node_ops.cordon(store, rt.liveness, who, body)),
        "Take no new placements on a node (its bookings run on), with a reason (H3).",
        Access("compute:nodes:manage", "node"),
    ),
    Method(
        "/api/compute/nodes/uncordon",
        s.NodesUncordon,
        s.NodeView,
        Write(lambda store, rt, who, body: node_ops.uncordon(store, rt.liveness, who, body)),
        "Undo a cordon or a drain: the node is schedulable again (H3).",
        Access("compute:nodes:manage", "node"),
    ),
    Method(
        "/api/compute/nodes/drain",
        s.NodesDrain,
        s.NodeView,
        Write(lambda store, rt, who, body: node_ops.drain(store, rt.liveness, who, body)),
        "Cordon and wait for the node's bookings to end; at the deadline they end (H3).",
        Access("compute:nodes:manage", "node"),
    ),
    Method(
        "/api/compute/nodes/remove",
        s.NodesRemove,
        s.NodeRemoved,
        write(node_ops.remove),
        "Remove a node: rows, atoms and credential go, the host may join any pool (H3).",
        Access("compute:nodes:manage", "node"),
    ),
)
