"""The NVLink fabric family's facts: no section of its own; its probe fills the `fabric` record
of every GPU the GPU family listed over NVML (where that family read nvidia-smi, its parser
reads the Fabric block). Node side: Python 3.6 and the standard library."""

NEEDS = ("gpu",)  # reads over the GPU family's NVML session, into the GPU records it wrote
PROFILE_KEYS = ()
SECTIONS = ()
