"""What operators watch: metrics, the cluster view, incident breakdowns, WAF history."""
