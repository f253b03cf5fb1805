"""Read-only renderings of nodes, requests and pools (rows, node detail, pool rows, Prometheus
text), shared by the CLI and the web app. Pure: callers pass the data.
"""
