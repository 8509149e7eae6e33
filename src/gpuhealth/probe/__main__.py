"""`python -m gpuhealth.probe` is `gpuhealth probe`: this node's facts document on stdout."""

import os
import sys

from gpuhealth.cli import main

code = main(["probe", *sys.argv[1:]])
sys.stdout.flush()
# A hung NVML call may still hold a worker thread: leave without waiting for it.
os._exit(code)
