"""What the tests and the benchmarks run beside Unicron, kept out of the shipped package: a real
etcd on loopback (``etcdlocal.py``)."""
