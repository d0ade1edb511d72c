"""The row and what follows from it: the pydantic models (rows), which fields are typed
columns and which the payload (layout), the one field-path grammar (paths), a dict of
columns as rows (columnar) and the Arrow schema of exports (arrow)."""
