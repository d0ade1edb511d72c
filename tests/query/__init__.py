"""The query builder: conditions, their SQL on SQLite and Postgres, and matches()."""
