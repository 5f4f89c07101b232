"""Capacity: the resource math (pure), the node_resources reconciler, rollups."""
