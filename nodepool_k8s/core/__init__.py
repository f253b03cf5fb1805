"""The pure domain: nodes, requests, resources, the record decoder, conditions, quota arithmetic
and errors. No I/O, no threads; imports nothing else of nodepool_k8s.
"""
