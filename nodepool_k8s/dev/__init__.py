"""Development only, never imported by production code: the Kubernetes API simulator and the test,
demo and benchmark helpers.
"""
