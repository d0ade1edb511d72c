"""The database: connections and read replicas, the schema and its migrations, where SQLite
and Postgres differ, statements compiled once, and one buffer's handle (the one place
driver errors become :class:`~expstore.errors.StorageError`) with its tuning knobs.

Below the features and the storage, above the query language: nothing here knows what a
sampler, a claim or a policy version is.
"""
