"""Control plane: the coordinator service, its store, node agents and process supervision."""
