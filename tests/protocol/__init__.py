"""The wire: produce/fetch encoding, record validation and walk, bad input, fuzzing."""
