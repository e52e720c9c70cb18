"""Dense attention forward (padded batches and packed variable-length sequences)."""
