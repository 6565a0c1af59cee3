"""Tablefinder: a small restaurant-booking site served on loopback by the web env (Agent Q's setting).

Server-rendered HTML with no scripts: every page is reproduced by its URL (POSTs redirect to GETs), and
the only server-side state is each session's reservations, so the env can snapshot and restore it.
"""
