"""Record formats: bytes on the wire → Arrow columns of the declared schema (or a reason)."""
