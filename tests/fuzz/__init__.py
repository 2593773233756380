"""Differential fuzzing of polyc: random TC programs (gen), an independent numpy
interpreter of TC semantics (interp), a shrinker (shrink) and a campaign driver."""
