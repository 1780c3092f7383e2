"""Sans-I/O SASL server state machines (PLAIN, OAUTHBEARER)."""
