"""Records: their contract (schema: Record, and the Payload a rank is handed), writing and reading them (store)."""
