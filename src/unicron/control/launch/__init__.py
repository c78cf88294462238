"""Starting clusters: an embedded local cluster, Slurm jobs, a local etcd, network-namespace test hosts."""
