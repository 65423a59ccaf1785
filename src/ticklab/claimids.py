"""The claim ids, without the analysis: what the CLI and doctor need to name claims (ticklab.claims.CLAIMS
holds the same ids with their notebooks and modules, and imports pandas and scipy; tests keep the two equal)."""

CLAIM_IDS = ("hpet", "pvspinlock", "hrtick", "acpi-idle", "nohz")
