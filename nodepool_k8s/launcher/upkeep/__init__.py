"""Keeping the fleet clean: cleanup passes, node deletion, the leak sweep, drift replacement, drain
and maintenance windows.
"""
