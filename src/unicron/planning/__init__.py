"""Planning: throughput model, cost model (WAF) and the optimal-plan solver. Pure functions."""
