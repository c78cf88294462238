"""The store: typed rows, their backends (SQLite, etcd), the journal, leadership."""
