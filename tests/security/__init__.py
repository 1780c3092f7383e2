"""Authentication, authorization, TLS, tenants, audit."""
