"""Security analytics over the broker's audit events (topic ``public/__kafka/__audit``):
per-tenant and per-principal summaries, failures per minute, top denied principals and
sources, password-guessing bursts (batch report), and burst alerts (streaming)."""
