"""The node side's core: facts collection over the families, commands with timeouts, NVML.

Python 3.6 and the standard library only (plus nvidia-ml-py when importable): transport.py
ships these modules, the families' `probe.py` and what they import to the node in one command.
"""
