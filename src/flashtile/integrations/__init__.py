"""Adapters that plug flashtile into other libraries; each imports its library only when used."""
