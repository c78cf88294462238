"""The service: the HTTP API, the agents' channel, tokens and their checks, the dashboard."""
