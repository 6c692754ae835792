"""Framing: Connect envelopes, end-stream JSON, gRPC-Web trailers, BidiService unwrapping."""
