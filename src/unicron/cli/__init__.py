"""The ``unicron`` command: thin wrappers that parse arguments and print results."""
