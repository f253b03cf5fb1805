"""Handling one node request: the request handler, allocation (reuse, quota, guarded create),
launches, and the min-ready requests.
"""
