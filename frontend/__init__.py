"""Frontends: TC language and einsum strings -> polyc IR."""
