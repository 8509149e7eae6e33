"""The NVLink fabric family's facts: none of its own yet; it judges the `fabric` record of
every GPU, which the GPU family writes. Node side: Python 3.6 and the standard library."""

NEEDS = ("gpu",)
PROFILE_KEYS = ()
SECTIONS = ()
