"""The node-side probe: stdlib only (plus nvidia-ml-py when importable).

The whole package is shipped to the node in one command and prints one facts document.
"""
