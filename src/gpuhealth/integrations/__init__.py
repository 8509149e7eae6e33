"""Acting on verdicts through what a fleet already runs: Slurm, Kubernetes, Prometheus and
the node health service NVIDIA's ft_launcher asks before every rendezvous.

Every action that changes something outside gpuhealth is a dry run unless `--apply` is given,
and says what it did (or would do); none touches what gpuhealth did not set itself.
"""
