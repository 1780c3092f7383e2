"""Facts every layer shares (the name rule); depends on nothing, every layer may import it."""
