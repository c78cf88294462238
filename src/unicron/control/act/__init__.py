"""Acting: the one place that writes the store, posts to the tasks' rendezvous stores and queues orders."""
