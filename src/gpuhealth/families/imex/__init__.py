"""IMEX family: the daemon that makes a multi-node NVLink domain (GB200/GB300 NVL72) one
memory domain runs, and every node of its domain is ready and connected."""
