"""Node methods: join tokens, join, report, spec, list, get."""

from controlplane.api.method import Method, Read, Write
from controlplane.services import joining, node_ops, nodes, reports
from controlplane.services.access import Access
from shared import schemas as s

METHODS = (
    Method(
        "/api/compute/joinTokens/create",
        s.JoinTokensCreate,
        s.JoinTokenCreated,
        Write(joining.create_join_token),
        "A pool-scoped, expiring, limited-use join token (owner only); shown once.",
        Access("compute:nodes:join", "owned-pool"),
    ),
    Method(
        "/api/compute/nodes/join",
        s.NodesJoin,
        s.NodeJoined,
        Write(joining.join_node),
        "Join a pool with an attestor (join-token: the token in the body); answers the node credential once.",
        Access("compute:nodes:join", "attestor"),
    ),
    Method(
        "/api/compute/nodes/report",
        s.NodesReport,
        s.Reported,
        Write(reports.report_node),
        "A node reports its inventory (node credential); an unchanged one writes nothing.",
        Access("compute:nodes:report", "own-node"),
    ),
    Method(
        "/api/compute/nodes/spec",
        s.NodesSpec,
        s.NodeSpec,
        Read(reports.node_spec),
        "The node's desired state (node credential).",
        Access("compute:nodes:spec", "own-node"),
    ),
    Method(
        "/api/compute/nodes/list",
        s.NodesList,
        s.NodeList,
        Read(nodes.list_nodes, offload=True),
        "A pool's nodes, or without poolId the fleet's (every pool the tenant owns), by id, a "
        "page at a time (owner only; B1: limit, default 100, and cursor; next is null at the end).",
        Access("compute:nodes:read", "owned-pools"),
    ),
    Method(
        "/api/compute/nodes/get",
        s.NodesGet,
        s.NodeView,
        Read(nodes.get_node),
        "One node with its resource rows and GPU atoms (owner only).",
        Access("compute:nodes:read", "node"),
    ),
    Method(
        "/api/compute/nodes/cordon",
        s.NodesCordon,
        s.NodeView,
        Write(node_ops.cordon),
        "Take no new placements on a node (its bookings run on), with a reason (H3).",
        Access("compute:nodes:manage", "node"),
    ),
    Method(
        "/api/compute/nodes/uncordon",
        s.NodesUncordon,
        s.NodeView,
        Write(node_ops.uncordon),
        "Undo a cordon or a drain: the node is schedulable again (H3).",
        Access("compute:nodes:manage", "node"),
    ),
    Method(
        "/api/compute/nodes/drain",
        s.NodesDrain,
        s.NodeView,
        Write(node_ops.drain),
        "Cordon and wait for the node's bookings to end; at the deadline they end (H3).",
        Access("compute:nodes:manage", "node"),
    ),
    Method(
        "/api/compute/nodes/remove",
        s.NodesRemove,
        s.NodeRemoved,
        Write(node_ops.remove),
        "Remove a node: rows, atoms and credential go, the host may join any pool (H3).",
        Access("compute:nodes:manage", "node"),
    ),
)
