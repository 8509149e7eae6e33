"""`python -m gpuhealth.probe ['{"root": "/"}']`: print this node's facts document."""

import json
import os
import sys

from gpuhealth.probe.main import main

main(json.loads(sys.argv[1]) if len(sys.argv) > 1 else None)
# A hung NVML call may still hold a worker thread: leave without waiting for it.
os._exit(0)
