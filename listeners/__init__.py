"""Listeners: specs, TLS contexts, asyncio servers, framing and pipelining."""
