"""What the launcher tells others: pool status records, the global gauges (stats leader) and the
web app's status source.
"""
