"""Cluster state: the Kubernetes client, list+watch reflectors and the views built from them.

The layer below the server (`webhook/`) and the CLIs (`certs/`, `webhook/cmd_*`): it imports neither of them,
and nothing here makes decisions (that is `policies/`). Imports go one way: webhook, certs -> cluster.
"""
