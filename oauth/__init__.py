"""OAuth: token validation (server callback) and client-credentials login callback."""
