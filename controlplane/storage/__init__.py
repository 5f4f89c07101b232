"""SQLite storage: the connection, migrations, and SQL, one module per table group."""
