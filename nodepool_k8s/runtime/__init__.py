"""Process plumbing any layer may use: clocks, cancellation, guarded threads, input validation,
logging, sd_notify and statsd. No business rules.
"""
