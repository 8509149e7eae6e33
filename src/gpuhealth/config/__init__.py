"""Per-SKU limit profiles and the inventory variables that override them, validated.

Everything is validated when the run starts, so a typo in a YAML file is one usage error that
names the file and the key instead of hundreds of broken tests. Three parts: `limits` composes
the families' profile keys into one model (and translates pydantic's errors), `profiles` loads
the profiles and matches a host's platform to one, `inventory` reads a host's variables and
resolves its limits. Callers import from here.
"""

from gpuhealth.config.inventory import Expectations, expectations_from_vars, resolve_limits
from gpuhealth.config.limits import (
    PROFILE_ONLY,
    ConfigError,
    Profile,
    key_table,
    limits_model,
    plain,
    validate,
)
from gpuhealth.config.profiles import Platform, ProfileSet

__all__ = [
    "PROFILE_ONLY",
    "ConfigError",
    "Expectations",
    "Platform",
    "Profile",
    "ProfileSet",
    "expectations_from_vars",
    "key_table",
    "limits_model",
    "plain",
    "resolve_limits",
    "validate",
]
