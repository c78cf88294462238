"""Vocabulary shared by every layer: specs, hardware catalogue, errors, events. No I/O."""
