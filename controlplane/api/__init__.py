"""HTTP: the route table and one module per noun. Handlers parse, authenticate, call a service."""
